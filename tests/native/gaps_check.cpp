// The treap of gap widths (baechi_tf/placer/native/gaps.hpp) against plain sorted vectors that
// book and search as scheduler_state._close_in and SchedulerState._slot do: random bookings, and
// bookings mostly after every other, as schedules make them. Built and run by test_native_gaps.py.
#include "gaps.hpp"
#include <cstdio>
#include <random>
#include <algorithm>
struct Naive {
  std::vector<double> s, e;
  void close_in(double a, double b, double gap) {
    auto i = std::lower_bound(s.begin(), s.end(), a) - s.begin();
    if (i > 0 && e[i-1] + gap > a) { i -= 1; a = s[i]; b = std::max(b, e[i]); s.erase(s.begin()+i); e.erase(e.begin()+i); }
    while (i < (long)s.size() && s[i] < b + gap) { b = std::max(b, e[i]); s.erase(s.begin()+i); e.erase(e.begin()+i); }
    s.insert(s.begin()+i, a); e.insert(e.begin()+i, b);
  }
  double fit(double t, double w) const {
    if (!e.empty() && e.back() > t) {
      long i = std::upper_bound(e.begin(), e.end(), t) - e.begin();
      while (i < (long)e.size() && s[i] < t + w) { t = e[i]; i++; }
    }
    return t;
  }
};
int main() {
  std::mt19937_64 rng(1);
  long checks = 0;
  for (int round = 0; round < 3000; ++round) {
    baechi::GapTreap tr; Naive nv;
    double gaps[] = {0.0, 0.25, 1.5, 7.0, 134.0};
    double gap = gaps[rng() % 5];
    double scale = (rng() % 3 == 0) ? 1e9 : 1.0;
    int n = rng() % 200;
    for (int k = 0; k < n; ++k) {
      double a = scale + (rng() % 4000) / 4.0 + (rng()%7==0 ? 0.1 : 0.0);
      double b = a + 0.25 + (rng() % 200) / 4.0;
      tr.close_in(a, b, gap); nv.close_in(a, b, gap);
      std::vector<double> s2, e2; tr.to_lists(s2, e2);
      if (s2 != nv.s || e2 != nv.e) { printf("lists differ round %d k %d\n", round, k); return 1; }
      for (int q = 0; q < 5; ++q) {
        double t = scale + (rng() % 4400) / 4.0 - 10;
        double w = (rng() % 400) / 4.0 + 0.01 * (rng()%3);
        if (w <= 0) w = 0.5;
        double x = tr.fit(t, w), y = nv.fit(t, w);
        checks++;
        if (x != y) { printf("fit differs round %d: %.17g vs %.17g (t %.17g w %.17g)\n", round, x, y, t, w); return 1; }
      }
    }
    if (round % 7 == 0) { std::vector<double> s2, e2; tr.to_lists(s2, e2); baechi::GapTreap t2; t2.from_lists(s2, e2);
      for (int q = 0; q < 50; ++q) { double t = scale + (rng() % 4400) / 4.0; double w = (rng() % 400) / 4.0 + 0.5;
        if (t2.fit(t, w) != nv.fit(t, w)) { printf("rebuilt differs\n"); return 1; } } }
  }
  for (int round = 0; round < 2000; ++round) {  // mostly appended, as schedules book
    baechi::GapTreap tr; Naive nv; double t = (round % 3 == 0) ? 1e9 : 0.0;
    double gap = (round % 4) * 1.5;
    for (int k = 0; k < 300; ++k) {
      double a = t + (rng() % 40) / 4.0 - ((rng() % 9 == 0) ? (rng() % 400) / 4.0 : 0.0);
      double b = a + 0.25 + (rng() % 80) / 4.0; t = std::max(t, a);
      tr.close_in(a, b, gap); nv.close_in(a, b, gap);
      std::vector<double> s2, e2; tr.to_lists(s2, e2);
      if (s2 != nv.s || e2 != nv.e) { printf("append lists differ round %d k %d\n", round, k); return 1; }
      double q = a - (rng() % 400) / 4.0, w = (rng() % 60) / 4.0 + 0.25;
      if (tr.fit(q, w) != nv.fit(q, w)) { printf("append fit differs\n"); return 1; }
      checks++;
    }
  }
  printf("ok %ld checks\n", checks);
  return 0;
}
