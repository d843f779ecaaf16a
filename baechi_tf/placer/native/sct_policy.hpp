// m-SCT's device rule for the compiled list scheduler (scheduler.cpp): a port, step for step, of
// `FavouriteChildPolicy` in baechi_tf/placer/m_sct.py, which stays the reference and says what
// the rule is (reservations for favourite children, urgent ops, holds and their floor).
//
// Exactness: the same dry runs in the same order (`any` stops at the first earlier start, `max`
// looks at every device), the same float comparisons and the same memo of starts per commit, so
// that the scheduler's counters of work (dry runs, copies given a slot) and its schedules are the
// Python engine's to the bit; tests/test_engines.py compares them.
//
// `State` is the scheduler; the policy reads it through these members:
//   i64 committed_ops() const              len(state.order): the memo's and the checks' epoch
//   double dry_ready(i64 op, int dev)       SchedulerState.ready_time(op, dev)[0], a dry run
//   double free_at(int dev) const           state.device_free[dev]
//   double latest_free() const              max(state.device_free)
//   i64 last_op_on(int dev) const           state.last_op[dev]
//   i64 device_of(i64 op) const             state.device[op]
//   i64 preds_left_of(i64 op) const         state.preds_left[op]
//   i64 group_device_of(i64 op) const       state.group_device[state.group_of[op]]
//   bool group_fits(i64 op, int dev) const  peak + the group's persistent bytes <= persistent_cap
//   const std::vector<int>& devices() const state.distinct, ascending
//
// Time per call: `hold` O(D) dry runs at most (memoised per commit), `committed` O(D + H log H)
// for H ops held on the devices released; memory O(D + H) and one start per (op, device) dry run
// since the last commit.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace baechi {

template <class State>
class FavouriteChild {
 public:
    using i64 = std::int64_t;

    FavouriteChild() = default;
    // child[op]: op's favourite child, -1 for none; nd devices.
    FavouriteChild(std::vector<i64> child, int nd)
        : child_(std::move(child)), reserved_(nd, -1), checked_(nd, -1), held_(nd) {}

    // The favourite child `dev` is kept for, or -1 (`reservation`).
    i64 reservation(int dev, State& s) {
        i64 fc = reserved_[dev];
        if (fc >= 0) return fc;
        i64 epoch = s.committed_ops();
        if (checked_[dev] == epoch) return -1;
        checked_[dev] = epoch;
        i64 last = s.last_op_on(dev);
        fc = last >= 0 ? child_[last] : -1;
        if (fc < 0 || s.device_of(fc) >= 0 || s.preds_left_of(fc) > 0) return -1;
        if (!allowed(fc, dev, s)) return -1;
        double here = start(fc, dev, s);
        i64 gdev = s.group_device_of(fc);
        if (gdev < 0) {  // `allowed` holds devices other than dev
            for (int d : s.devices())
                if (d != dev && s.group_fits(fc, d) && start(fc, d, s) < here) return -1;
        }
        reserved_[dev] = fc;
        return fc;
    }

    // The latest of op's earliest starts over the devices its group may still use, memory
    // aside (`urgent_time`).
    double urgent_time(i64 op, State& s) {
        i64 gdev = s.group_device_of(op);
        if (gdev >= 0) return start(op, (int)gdev, s);
        const std::vector<int>& devices = s.devices();
        double out = start(op, devices[0], s);
        for (std::size_t k = 1; k < devices.size(); ++k) {
            double v = start(op, devices[k], s);
            if (v > out) out = v;
        }
        return out;
    }

    // Policy.hold: the earliest time op may start on dev, given its earliest feasible start.
    double hold(i64 op, int dev, double earliest, State& s) {
        i64 fc = reservation(dev, s);
        if (fc < 0 || fc == op) return earliest;
        double urgent = urgent_time(op, s);
        if (urgent <= earliest) return earliest;
        held_[dev].push_back(op);  // a set: `committed` sorts and drops repeats
        return urgent;
    }

    // Policy.hold_floor: (floor, the op exempt from it) while dev is kept for a favourite child.
    std::optional<std::pair<double, i64>> hold_floor(int dev, const State& s) const {
        i64 fc = reserved_[dev];
        if (fc < 0) return std::nullopt;
        return std::make_pair(s.latest_free(), fc);
    }

    // Policy.committed: ends the reservations that op's commit on dev ends and appends to
    // `released` the (op, device) pairs they held, per device ascending, ops ascending.
    void committed(i64 op, int dev, const State& s, std::vector<std::pair<i64, int>>& released) {
        for (int d = 0; d < (int)reserved_.size(); ++d) {
            i64 fc = reserved_[d];
            if (fc < 0) continue;
            i64 gdev = s.group_device_of(fc);
            if (d == dev || fc == op || (gdev >= 0 && gdev != d)) {
                reserved_[d] = -1;
                std::vector<i64>& held = held_[d];
                std::sort(held.begin(), held.end());
                held.erase(std::unique(held.begin(), held.end()), held.end());
                for (i64 w : held) released.emplace_back(w, d);
                held.clear();
            }
        }
    }

 private:
    std::vector<i64> child_, reserved_, checked_;
    std::vector<std::vector<i64>> held_;  // per device, the ops held there (repeats allowed)
    i64 epoch_ = -1;                       // commit count the memo is for
    std::unordered_map<i64, double> starts_;  // op * nd + dev -> start, this epoch

    // dev in `_allowed(op)`: the group's device, or a device its persistent memory fits on.
    bool allowed(i64 op, int dev, const State& s) const {
        i64 gdev = s.group_device_of(op);
        if (gdev >= 0) return gdev == dev;
        const std::vector<int>& devices = s.devices();
        return std::binary_search(devices.begin(), devices.end(), dev) && s.group_fits(op, dev);
    }

    // `_start`: when op's inputs and dev are ready, memory aside; memoised until the next commit.
    double start(i64 op, int dev, State& s) {
        i64 epoch = s.committed_ops();
        if (epoch_ != epoch) {
            epoch_ = epoch;
            starts_.clear();
        }
        i64 key = op * (i64)reserved_.size() + dev;
        auto found = starts_.find(key);
        if (found != starts_.end()) return found->second;
        double ready = s.dry_ready(op, dev);
        double free = s.free_at(dev);
        double out = free > ready ? free : ready;  // Python's max(ready, free)
        starts_.emplace(key, out);
        return out;
    }
};

}  // namespace baechi
