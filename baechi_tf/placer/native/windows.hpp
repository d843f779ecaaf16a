// Window balancing (`baechi_tf/placer/windows.py`), compiled: `_Loads` and the greedy passes of
// `balance_windows`, step for step. Every double is computed in the order the Python reference
// computes it (sequential sums, windows of a move summed in ascending order, no fused
// multiply-add), so both engines make the same moves and return the same placement and count;
// tests/test_engines.py holds them to it. The Python side draws the passes' shuffled orders
// (Python's own random) and checks that the byte counts fit int64.
//
// Time: O(passes * (V + E) * D^2) as the Python module; memory O(T * D + W * D) for T tensors
// and W windows.

#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace baechi {

// Compressed rows: the entries of row r are idx[ptr[r] .. ptr[r + 1]).
struct Rows {
    const std::int64_t* ptr;
    const std::int32_t* idx;
    std::int64_t size(std::int64_t r) const { return ptr[r + 1] - ptr[r]; }
    const std::int32_t* begin(std::int64_t r) const { return idx + ptr[r]; }
    const std::int32_t* end(std::int64_t r) const { return idx + ptr[r + 1]; }
};

struct WindowProblem {
    int num_devices;
    int num_windows;
    bool overlap;
    const double* compute;        // [V]
    const std::int32_t* window;   // [V]
    const double* slope;          // [D * D]
    const double* intercept;      // [D * D]
    const std::int64_t* tbytes;   // [T]
    const std::int32_t* tsrc;     // [T]
    std::int64_t num_ops, num_tensors;
    Rows ins, outs, consumers;    // tensors each op reads / sends; ops reading each tensor
};

class WindowLoads {  // windows._Loads
   public:
    static constexpr double kEven = 0.05;  // windows._EVEN

    WindowLoads(const WindowProblem& p, std::vector<int> device_of)
        : p_(p), nd_(p.num_devices), dev_(std::move(device_of)),
          cnt_((std::size_t)p.num_tensors * nd_, 0),
          load_((std::size_t)p.num_windows * 2 * nd_, 0.0),
          top_(p.num_windows, 0.0),
          is_touched_(p.num_windows, 0) {
        for (std::int64_t op = 0; op < p.num_ops; ++op) row(p.window[op])[dev_[op]] += p.compute[op];
        for (std::int64_t t = 0; t < p.num_tensors; ++t)
            for (const std::int32_t* c = p.consumers.begin(t); c != p.consumers.end(t); ++c)
                count(t, dev_[*c], +1);
        for (int w = 0; w < p.num_windows; ++w) top_[w] = window_top(w);
        clear_touched();
    }

    int device(std::int64_t op) const { return dev_[op]; }
    const std::vector<int>& devices() const { return dev_; }

    void move_op(std::int64_t op, int b) {
        const int a = dev_[op];
        if (a == b) return;
        const int w = p_.window[op];
        row(w)[a] -= p_.compute[op];
        row(w)[b] += p_.compute[op];
        touch(w);
        for (const std::int32_t* t = p_.ins.begin(op); t != p_.ins.end(op); ++t) count(*t, a, -1);
        for (const std::int32_t* t = p_.outs.begin(op); t != p_.outs.end(op); ++t) {
            const int* c = &cnt_[(std::size_t)*t * nd_];
            for (int d = 0; d < nd_; ++d)
                if (c[d] && d != a) transfer(*t, a, d, -1);
        }
        dev_[op] = b;
        for (const std::int32_t* t = p_.ins.begin(op); t != p_.ins.end(op); ++t) count(*t, b, +1);
        for (const std::int32_t* t = p_.outs.begin(op); t != p_.outs.end(op); ++t) {
            const int* c = &cnt_[(std::size_t)*t * nd_];
            for (int d = 0; d < nd_; ++d)
                if (c[d] && d != b) transfer(*t, b, d, +1);
        }
    }

    double delta() {  // _Loads.delta: the touched windows in ascending order
        std::sort(touched_.begin(), touched_.end());
        double change = 0.0;
        for (int w : touched_) change += window_top(w) - top_[w];
        return change;
    }

    void settle() {
        for (int w : touched_) top_[w] = window_top(w);
        clear_touched();
    }

    void clear_touched() {
        for (int w : touched_) is_touched_[w] = 0;
        touched_.clear();
    }

    double cost() const {
        double total = 0.0;
        for (double t : top_) total += t;
        return total;
    }

   private:
    double* row(int w) { return &load_[(std::size_t)w * 2 * nd_]; }

    void touch(int w) {
        if (!is_touched_[w]) {
            is_touched_[w] = 1;
            touched_.push_back(w);
        }
    }

    double window_top(int w) {  // _Loads._top
        const double* r = row(w);
        const int n = p_.overlap ? 2 * nd_ : nd_;
        double most = 0.0, squares = 0.0;
        for (int d = 0; d < n; ++d) {
            const double v = p_.overlap ? r[d] : r[d] + r[nd_ + d];
            if (d == 0 || v > most) most = v;
            squares += v * v;
        }
        return most + kEven * std::sqrt(squares);
    }

    void transfer(std::int64_t t, int a, int b, int sign) {  // _Loads._transfer
        const std::size_t ab = (std::size_t)a * nd_ + b;
        const double tt = sign * (p_.slope[ab] * (double)p_.tbytes[t] + p_.intercept[ab]);
        const int w = p_.window[p_.tsrc[t]];
        double* r = row(w);
        r[nd_ + a] += tt;
        r[nd_ + b] += tt;
        touch(w);
    }

    void count(std::int64_t t, int d, int delta) {  // _Loads._count
        int& c = cnt_[(std::size_t)t * nd_ + d];
        const int before = c;
        c = before + delta;
        const int src_dev = dev_[p_.tsrc[t]];
        if (d != src_dev && (before == 0) != (c == 0)) transfer(t, src_dev, d, delta);
    }

    const WindowProblem& p_;
    const int nd_;
    std::vector<int> dev_;
    std::vector<int> cnt_;       // [T * D] consumers of each tensor on each device
    std::vector<double> load_;   // [W * 2D] compute, then channel, per device
    std::vector<double> top_;    // [W] each window's cost when last settled
    std::vector<int> touched_;   // windows changed since the last settle or clear
    std::vector<char> is_touched_;
};

struct WindowSearch {
    Rows members;                             // each group's ops
    const std::int64_t* group_persistent;     // [G]
    std::vector<std::int64_t> on_device;      // [D] persistent bytes of the groups on each
    const std::int64_t* room;                 // [D]
    const std::int32_t* orders;               // [passes * num_movable] each pass's group order
    std::int64_t passes, num_movable;
    int targets;
    std::int64_t per_move;
    std::int64_t max_moves;                   // < 0: no limit
    double min_pass_gain;
};

// balance_windows' passes; returns the op moves evaluated, `loads` holding the placement.
inline std::int64_t balance(WindowLoads& loads, WindowSearch& s) {
    std::int64_t evaluated = 0;
    for (std::int64_t pass = 0; pass < s.passes; ++pass) {
        const double before = loads.cost();
        bool improved = false;
        const std::int32_t* order = s.orders + pass * s.num_movable;
        for (std::int64_t k = 0; k < s.num_movable; ++k) {
            if (s.max_moves >= 0 && evaluated >= s.max_moves) break;
            const std::int32_t g = order[k];
            const std::int32_t* m0 = s.members.begin(g);
            const std::int32_t* m1 = s.members.end(g);
            const int a = loads.device(*m0);
            bool found = false;
            double best_gain = 0.0;
            int best = -1;
            for (int b = 0; b < s.targets; ++b) {
                if (b == a || s.on_device[b] + s.group_persistent[g] > s.room[b]) continue;
                evaluated += 2 * s.members.size(g) * s.per_move;
                for (const std::int32_t* o = m0; o != m1; ++o) loads.move_op(*o, b);
                const double gain = loads.delta();
                if (gain < -1e-6 && (!found || gain < best_gain)) {
                    found = true;
                    best_gain = gain;
                    best = b;
                }
                for (const std::int32_t* o = m0; o != m1; ++o) loads.move_op(*o, a);
                loads.clear_touched();  // back where it was: the tops still hold
            }
            if (found) {
                for (const std::int32_t* o = m0; o != m1; ++o) loads.move_op(*o, best);
                loads.settle();
                s.on_device[a] -= s.group_persistent[g];
                s.on_device[best] += s.group_persistent[g];
                improved = true;
            }
        }
        if (!improved || before - loads.cost() < s.min_pass_gain * before) break;
    }
    return evaluated;
}

}  // namespace baechi
