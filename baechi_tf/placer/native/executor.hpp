// TensorFlow's executor on pools of threads, emulated (`baechi_tf/placer/executor_order.py`,
// `_emulated_times`), compiled: step for step the Python reference, so that both give the same
// start and end of every op (tests/test_engines.py holds them to it). Events are taken by (time,
// sequence number); a random choice among m > 1 takes the next of the given draws u and picks the
// (i64)(u * m)-th.
//
// Time O((V + E) log V) for V ops and E edges; memory O(V + threads).

#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <queue>
#include <stdexcept>
#include <tuple>
#include <vector>

namespace baechi {

struct EmulatedStep {
    std::vector<double> start, end;
};

// succ_ptr/succ: each op's distinct successors (CSR); pending: its distinct predecessors' count;
// dev, pool: its device and that device's pool; inline_op: whether it runs on the thread that made
// it ready; took: its duration; size: threads per pool; draws: the random numbers, 2 per op.
inline EmulatedStep emulate_step(std::int64_t n, const std::int64_t* succ_ptr, const std::int64_t* succ,
                                 const std::int64_t* dev, const std::int64_t* pool, const std::int64_t* inline_op,
                                 const double* took, const std::vector<std::int64_t>& size, const double* draws,
                                 std::int64_t num_draws) {
    using i64 = std::int64_t;
    const i64 pools = (i64)size.size();
    std::vector<i64> first(pools + 1, 0);
    for (i64 p = 0; p < pools; ++p) first[p + 1] = first[p] + size[p];
    const i64 threads = first[pools];
    std::vector<i64> pending(n, 0);
    for (i64 v = 0; v < n; ++v)
        for (i64 e = succ_ptr[v]; e < succ_ptr[v + 1]; ++e) ++pending[succ[e]];
    std::vector<std::deque<i64>> queues(threads), ahead(threads);
    std::vector<i64> running(threads, -1), pool_of_thread(threads);
    for (i64 p = 0; p < pools; ++p)
        for (i64 t = first[p]; t < first[p + 1]; ++t) pool_of_thread[t] = p;
    std::vector<std::vector<i64>> idle(pools);
    std::vector<char> wake(pools, 0);
    EmulatedStep out{std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
    i64 used = 0;
    auto choose = [&](i64 m) -> i64 {
        if (m == 1) return 0;
        if (used >= num_draws) throw std::invalid_argument("emulated_times: the draws ran out");
        return (i64)(draws[used++] * (double)m);
    };
    auto outside = [&](i64 v) {
        const i64 p = pool[v];
        queues[first[p] + choose(size[p])].push_back(v);
        wake[p] = 1;
    };
    for (i64 v = 0; v < n; ++v)
        if (pending[v] == 0) outside(v);
    using Event = std::tuple<double, i64, i64>;  // time, sequence, thread
    std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events;
    for (i64 t = 0; t < threads; ++t) events.emplace(0.0, t, t);
    i64 sequence = threads;
    std::vector<i64> expensive;
    while (!events.empty()) {
        const auto [now, seq, t] = events.top();
        (void)seq;
        events.pop();
        const i64 p = pool_of_thread[t];
        std::deque<i64>& queue = queues[t];
        std::deque<i64>& next_up = ahead[t];
        const i64 v = running[t];
        if (v >= 0) {
            running[t] = -1;
            expensive.clear();
            for (i64 e = succ_ptr[v]; e < succ_ptr[v + 1]; ++e) {
                const i64 w = succ[e];
                if (--pending[w]) continue;
                if (dev[w] != dev[v]) {
                    if (pool[w] == p) queue.push_front(w);
                    else outside(w);
                } else if (inline_op[w]) {
                    next_up.push_back(w);
                } else {
                    expensive.push_back(w);
                }
            }
            if (!expensive.empty()) {
                for (size_t k = 0; k + 1 < expensive.size(); ++k) queue.push_front(expensive[k]);
                if (!next_up.empty()) queue.push_front(expensive.back());
                else next_up.push_back(expensive.back());
            }
            if (!queue.empty()) wake[p] = 1;
        }
        i64 nxt = -1;
        if (!next_up.empty()) {
            nxt = next_up.front();
            next_up.pop_front();
        } else if (!queue.empty()) {
            nxt = queue.front();
            queue.pop_front();
        } else {
            std::vector<i64> victims;
            for (i64 o = first[p]; o < first[p + 1]; ++o)
                if (!queues[o].empty()) victims.push_back(o);
            if (!victims.empty()) {
                std::deque<i64>& from = queues[victims[choose((i64)victims.size())]];
                nxt = from.back();
                from.pop_back();
            }
        }
        if (nxt < 0) {
            idle[p].push_back(t);
        } else {
            out.start[nxt] = now;
            out.end[nxt] = now + took[nxt];
            running[t] = nxt;
            events.emplace(out.end[nxt], sequence++, t);
        }
        for (i64 q = 0; q < pools; ++q) {
            if (!wake[q]) continue;
            wake[q] = 0;
            bool work = false;
            for (i64 o = first[q]; o < first[q + 1] && !work; ++o) work = !queues[o].empty();
            if (idle[q].empty() || !work) continue;
            for (i64 s : idle[q]) events.emplace(now, sequence++, s);
            idle[q].clear();
        }
    }
    for (i64 v = 0; v < n; ++v)
        if (pending[v]) throw std::logic_error("emulated_times: the emulated step left ops unrun");
    return out;
}

}  // namespace baechi
