// The compiled engine of baechi_tf's list scheduler: a port, step for step, of
// `ListScheduler`, `SchedulerState`, `UntouchedTwins` and `TailQueue` of baechi_tf/placer/
// (list_scheduler.py, scheduler_state.py, twins.py, tail_queues.py) for three policies:
// FixedPolicy (every op on a given device: the simulator), EarliestStartPolicy (m-ETF: any
// device, one of each set of untouched twins weighed) and m-SCT's FavouriteChildPolicy (m_sct.py,
// ported in sct_policy.hpp: devices kept for favourite children, the ops they hold pooled per
// device).
//
// Exactness: times are doubles computed in the order the Python reference computes them (no
// fused multiply-add: built with -ffp-contract=off), bytes are int64, `bisect` and `heapq` are
// ported algorithm for algorithm (the same probes, the same sift steps), so each heap holds its
// entries in the Python engine's order and ties break as Python's tuple comparison breaks them.
// tests/test_engines.py holds the two engines to identical schedules. See the Python module for
// the model; the comments here name the Python function each piece ports.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "executor.hpp"
#include "gaps.hpp"
#include "pieces.hpp"
#include "sct_policy.hpp"
#include "windows.hpp"

using baechi::FavouriteChild;
using baechi::GapTreap;

namespace py = pybind11;

namespace {

using baechi::bisect_left;
using baechi::bisect_right;
using baechi::close_in;
using baechi::Choice;
using baechi::Extra;
using baechi::heap_pop;
using baechi::heap_push;
using baechi::heap_replace;
using baechi::i64;
using baechi::kInf;
using baechi::Later;
using baechi::Member;
using baechi::Memo;
using baechi::Now;
using baechi::OpList;
using baechi::OpSet;
using baechi::Pending;
using baechi::PoolHolder;
using baechi::queue_hash;
using baechi::TailCopy;
using baechi::TailCopyPtr;
using baechi::TailQueue;
using baechi::Transfer;

template <class T>
std::vector<T> to_vector(py::array_t<T, py::array::c_style | py::array::forcecast> a) {
    auto r = a.template unchecked<1>();
    std::vector<T> out(r.shape(0));
    for (py::ssize_t i = 0; i < r.shape(0); ++i) out[i] = r(i);
    return out;
}

using I64Array = py::array_t<i64, py::array::c_style | py::array::forcecast>;
using F64Array = py::array_t<double, py::array::c_style | py::array::forcecast>;

// ------------------------------------------------------------------ GraphTables

struct Tables {
    i64 n = 0, num_tensors = 0;
    std::vector<double> compute;
    std::vector<i64> topo, topo_order;
    std::vector<i64> in_ptr, in_src, in_t, in_bytes;  // inputs of each op, in edge order
    std::vector<i64> consumers;
    std::vector<i64> rd_ptr, rd_op;      // readers of each tensor, in edge order
    std::vector<i64> succ_ptr, succ;     // successors of each op
    std::vector<i64> num_preds, alloc, free_at_end;
    // GraphTables.tensor_alias (kOwn, kHeldView or a tensor), tensor_src, tensor_bytes, and per op
    // its read outputs that reuse an input's buffer (`aliased`, as al_ptr/al_t); per tensor,
    // whether it is a constant's value (GraphTables.constant) and whether it reuses a buffer
    // whose last holder its op is in every order (GraphTables.always_reused), and the input its op
    // writes into instead when that buffer is not free after all, or -1 (GraphTables.fallback)
    std::vector<i64> tensor_alias, tensor_src, tensor_bytes, al_ptr, al_t, constant, always_reused, fallback;
    // GraphTables.memo_of: per op, the first op of the same inputs in order (neither with an
    // output in an input's buffer), whose dry runs it shares; else itself.
    std::vector<i64> memo_of;

    Tables(i64 n_, i64 nt, F64Array compute_, I64Array topo_, I64Array topo_order_, I64Array in_ptr_,
           I64Array in_src_, I64Array in_t_, I64Array in_bytes_, I64Array consumers_, I64Array rd_ptr_,
           I64Array rd_op_, I64Array succ_ptr_, I64Array succ_, I64Array num_preds_, I64Array alloc_,
           I64Array free_at_end_, I64Array tensor_alias_, I64Array tensor_src_, I64Array tensor_bytes_,
           I64Array al_ptr_, I64Array al_t_, I64Array constant_, I64Array always_reused_, I64Array fallback_)
        : n(n_), num_tensors(nt), compute(to_vector(compute_)), topo(to_vector(topo_)),
          topo_order(to_vector(topo_order_)), in_ptr(to_vector(in_ptr_)), in_src(to_vector(in_src_)),
          in_t(to_vector(in_t_)), in_bytes(to_vector(in_bytes_)), consumers(to_vector(consumers_)),
          rd_ptr(to_vector(rd_ptr_)), rd_op(to_vector(rd_op_)), succ_ptr(to_vector(succ_ptr_)),
          succ(to_vector(succ_)), num_preds(to_vector(num_preds_)), alloc(to_vector(alloc_)),
          free_at_end(to_vector(free_at_end_)), tensor_alias(to_vector(tensor_alias_)),
          tensor_src(to_vector(tensor_src_)), tensor_bytes(to_vector(tensor_bytes_)),
          al_ptr(to_vector(al_ptr_)), al_t(to_vector(al_t_)), constant(to_vector(constant_)),
          always_reused(to_vector(always_reused_)), fallback(to_vector(fallback_)) {
        memo_of.resize(n);
        std::unordered_map<std::uint64_t, std::vector<i64>> firsts;  // hash of the inputs -> ops
        for (i64 op = 0; op < n; ++op) {
            memo_of[op] = op;
            if (al_ptr[op + 1] > al_ptr[op]) continue;
            const i64 lo = in_ptr[op], hi = in_ptr[op + 1];
            std::uint64_t h = 1469598103934665603ull ^ (std::uint64_t)(hi - lo);
            for (i64 k = lo; k < hi; ++k) {  // FNV-1a over (producer, tensor)
                h = (h ^ (std::uint64_t)in_src[k]) * 1099511628211ull;
                h = (h ^ (std::uint64_t)in_t[k]) * 1099511628211ull;
            }
            auto& ops = firsts[h];
            for (i64 other : ops) {
                const i64 olo = in_ptr[other];
                if (in_ptr[other + 1] - olo == hi - lo &&
                    std::equal(in_src.begin() + lo, in_src.begin() + hi, in_src.begin() + olo) &&
                    std::equal(in_t.begin() + lo, in_t.begin() + hi, in_t.begin() + olo)) {
                    memo_of[op] = other;
                    break;
                }
            }
            if (memo_of[op] == op) ops.push_back(op);
        }
    }
};

constexpr i64 kOwn = -1, kHeldView = -2;  // list_scheduler.OWN, HELD_VIEW

// A cluster's links (`Cluster.channel_tables`): a copy from a to b holds the channels of a and b
// for slope[a * nd + b] * bytes + intercept[a * nd + b] (the held part of the link's intercept:
// over its `CommCost.copies_in_flight`), arrives latency[a * nd + b] (the rest) after that, and,
// when sends_on_compute[a] (`Device.sends_on_compute`), starts only when a runs no op; that hold
// is compute time of a and of b where they send on compute (`SchedulerState.commit`);
// b reads a's buffer, no copy of its own, if shares[a * nd + b] (`Cluster.shares_memory`).
struct Links {
    std::vector<double> slope, intercept, latency;
    std::vector<char> sends_on_compute, shares;
    Links(F64Array slope_, F64Array intercept_, F64Array latency_, const std::vector<bool>& sends,
          const std::vector<bool>& shares_)
        : slope(to_vector(slope_)), intercept(to_vector(intercept_)), latency(to_vector(latency_)),
          sends_on_compute(sends.begin(), sends.end()), shares(shares_.begin(), shares_.end()) {}
};

// ------------------------------------------------------------------ the scheduler

enum Status { kGoOn = 0, kNoChoice = 1, kCutOff = 2 };
// The policy a scheduler runs (`native_scheduler.POLICIES` gives the same numbers).
enum PolicyKind { kFixed = 0, kEarliestStart = 1, kFavouriteChild = 2 };

class Scheduler {
   public:
    Scheduler(std::shared_ptr<Tables> tables, int nd, I64Array group_of, I64Array group_persistent,
              I64Array gm_ptr, I64Array gm_op, I64Array capacity, I64Array persistent_cap,
              std::shared_ptr<Links> links, double min_transfer_us, int policy,
              I64Array device_of, I64Array child, I64Array twin_set_of,
              std::vector<std::vector<int>> untouched, std::vector<int> distinct, std::vector<std::pair<i64, int>> placements,
              I64Array initial_group_device,
              double cutoff_us, bool queue_tails, bool once_in_now)
        : T_(std::move(tables)), n_(T_->n), nd_(nd), group_of_(to_vector(group_of)),
          group_persistent_(to_vector(group_persistent)), gm_ptr_(to_vector(gm_ptr)),
          gm_op_(to_vector(gm_op)), capacity_(to_vector(capacity)),
          persistent_cap_(to_vector(persistent_cap)), links_(std::move(links)),
          slope_(links_->slope.data()), intercept_(links_->intercept.data()), latency_(links_->latency.data()),
          min_transfer_us_(min_transfer_us),
          fixed_(policy == kFixed), sct_(policy == kFavouriteChild),
          device_of_(fixed_ ? to_vector(device_of) : std::vector<i64>()),
          cutoff_us_(cutoff_us), queue_tails_(queue_tails), once_(once_in_now) {
        // SchedulerState.__init__
        tensor_consumers_left_ = T_->consumers;
        preds_left_ = T_->num_preds;
        group_device_.assign(group_persistent_.size(), -1);
        device_.assign(n_, -1);
        start_.assign(n_, 0.0);
        end_.assign(n_, 0.0);
        device_free_.assign(nd_, 0.0);
        last_op_.assign(nd_, -1);
        chan_start_.resize(nd_);
        chan_end_.resize(nd_);
        busy_start_.resize(nd_);
        busy_end_.resize(nd_);
        pairs_of_.resize(nd_);
        chan_version_.assign(nd_, 0);
        ready_memo_.resize(n_);
        arrival_.resize(T_->num_tensors);
        usage_.assign(nd_, 0);
        peak_.assign(nd_, 0);
        pending_.resize(nd_);
        release_.resize(T_->num_tensors);
        claims_.resize(T_->num_tensors);
        auto so = to_vector(twin_set_of);
        set_of_.assign(so.begin(), so.end());
        untouched_ = std::move(untouched);
        distinct_ = std::move(distinct);
        // place_pinned and the initial groups, as decided in Python
        for (auto& [g, dev] : placements) place_group(g, dev);
        auto given = initial_group_device.unchecked<1>();
        for (py::ssize_t g = 0; g < given.shape(0); ++g)
            if (given(g) >= 0 && group_device_[g] < 0) place_group(g, (int)given(g));
        // ListScheduler.__init__
        later_.resize(nd_);
        now_.resize(nd_);
        in_now_.resize(nd_);
        waiting_.resize(nd_);
        waited_.assign(nd_, false);
        dead_.resize(nd_);
        is_busy_.assign(nd_, false);
        pool_of_.assign(nd_, -1);
        if (sct_) {  // child[op]: op's favourite child; any negative value is none
            std::vector<i64> fc = to_vector(child);
            if ((i64)fc.size() != n_ || std::any_of(fc.begin(), fc.end(), [this](i64 c) { return c >= n_; }))
                throw py::value_error("favourite children: one op id or a negative number per op");
            sct_policy_ = FavouriteChild<Scheduler>(std::move(fc), nd_);
        }
        for (i64 op : T_->topo_order)
            if (preds_left_[op] == 0) push_ready(op, 0.0);
    }

    // Runs up to `max_steps` steps, fewer once they have made `max_evaluations` dry runs (a step
    // may make thousands when ready ops wait on a busy channel): (status, steps made).
    std::pair<int, i64> run(i64 max_steps, i64 max_evaluations) {
        i64 until = evaluations_ + max_evaluations;
        for (i64 i = 0; i < max_steps; ++i) {
            int s = step();
            if (s != kGoOn) return {s, i};
            if (evaluations_ >= until) return {kGoOn, i + 1};
        }
        return {kGoOn, max_steps};
    }

    // ListScheduler.step: None when nothing can run, (op, device, start) when one was
    // committed, and (start,) when the next op would start after the cutoff.
    py::object step_one() {
        int status;
        {
            py::gil_scoped_release release;
            status = step();
        }
        if (status == kNoChoice) return py::none();
        if (status == kCutOff) return py::make_tuple(cutoff_start_);
        return py::make_tuple(std::get<0>(stepped_), std::get<1>(stepped_), std::get<2>(stepped_));
    }

    // ListScheduler.snapshot: a copy of everything a step changes; dry runs are not kept
    // (`restore` forgets them, as the Python engine does).
    std::shared_ptr<Scheduler> snapshot() {
        std::vector<std::vector<std::pair<int, Memo>>> memo;
        memo.swap(ready_memo_);
        auto out = std::make_shared<Scheduler>(*this);
        memo.swap(ready_memo_);
        out->ready_memo_.resize(n_);
        out->tail_copy_ = nullptr;  // into this scheduler's pool: transient anyway
        out->tail_bound_ = nullptr;
        return out;
    }

    // ListScheduler.restore: returns to `snap`, a snapshot of a scheduler of the same graph,
    // cluster and groups (maybe under another placement: this one's policy and its state stay,
    // as the Python engine's policy object does), which stays usable. The work counters go on;
    // queue ids only grow.
    void restore(const Scheduler& snap) {
        std::vector<i64> device_of = std::move(device_of_);
        FavouriteChild<Scheduler> sct_policy = std::move(sct_policy_);
        bool fixed = fixed_, sct = sct_, queue_tails = queue_tails_, once = once_;
        double cutoff = cutoff_us_;
        i64 evaluations = evaluations_, copy_slots = copy_slots_;
        i64 next_tail_id = next_tail_id_;
        *this = snap;
        device_of_ = std::move(device_of);
        sct_policy_ = std::move(sct_policy);
        fixed_ = fixed, sct_ = sct, queue_tails_ = queue_tails, once_ = once;
        cutoff_us_ = cutoff;
        evaluations_ = evaluations, copy_slots_ = copy_slots;
        next_tail_id_ = std::max(next_tail_id, snap.next_tail_id_);
        for (auto& m : ready_memo_) m.clear();
        busy_.clear();
        for (int d = 0; d < nd_; ++d) {
            is_busy_[d] = !later_[d].empty() || !now_[d].empty();
            if (is_busy_[d]) busy_.push_back(d);
        }
    }

    // refine._patched: a copy of this snapshot as if the groups of `moves` (persistent bytes,
    // from, to, their ops) had been on their new devices from the start. For the simulator's
    // one-op groups: an op's group is the op.
    std::shared_ptr<Scheduler> patched(const std::vector<std::tuple<i64, int, int, std::vector<i64>>>& moves) const {
        auto out = std::make_shared<Scheduler>(*this);  // a snapshot's: no dry runs to forget
        out->tail_copy_ = nullptr;
        out->tail_bound_ = nullptr;
        for (const auto& [p, d_from, d_to, ops] : moves) {
            out->usage_[d_from] -= p;
            out->peak_[d_from] -= p;
            out->usage_[d_to] += p;
            out->peak_[d_to] += p;
            for (i64 o : ops) {
                out->group_device_[o] = d_to;
                out->dead_[d_to].discard(o);
                if (out->device_[o] < 0 && out->preds_left_[o] == 0)
                    heap_push(out->later_[d_to], Later{out->last_time_, T_->topo[o], o});
            }
        }
        return out;
    }

    bool waited(int d) const { return waited_[d]; }

    // The state a step changes, as plain Python values: two schedulers (or snapshots) with equal
    // fingerprints continue alike. Heaps are given as their arrays.
    py::tuple fingerprint() const {
        py::list later, now, pending, queues;
        for (int d = 0; d < nd_; ++d) {
            py::list l, n, p;
            for (const auto& e : later_[d]) l.append(py::make_tuple(e.key, e.tp, e.op));
            for (const auto& e : now_[d]) n.append(py::make_tuple(e.tp, e.op));
            for (const auto& e : pending_[d]) p.append(py::make_tuple(e.when, e.nbytes));
            later.append(l), now.append(n), pending.append(p);
        }
        for (i64 qid = 0; qid < (i64)tail_queues_.size(); ++qid) {
            const TailQueue& q = tail_queues_[qid];
            if (!q.alive) continue;
            py::list members;
            for (const auto& m : q.members) members.append(py::make_tuple(m.tp, m.op, m.start));
            queues.append(py::make_tuple(qid, q.device, q.pool, q.sources, q.widths, q.since, members,
                                         q.has_entry, q.entry_key, q.entry_tp, q.now));
        }
        py::list transfers, claims;
        for (const auto& cs : claims_) {
            py::list c;
            for (const auto& x : cs) c.append(py::make_tuple(x.device, x.holders, x.when));
            claims.append(c);
        }
        for (const auto& t : transfers_) transfers.append(py::make_tuple(t.tensor, t.src, t.dst, t.start, t.end));
        return py::make_tuple(
            scheduled_, last_time_, device_, start_, end_, order_, device_free_, last_op_, usage_, peak_,
            tensor_consumers_left_, preds_left_, group_device_, chan_start_, chan_end_, busy_start_, busy_end_, pending, arrival_,
            release_, claims, set_of_, untouched_, distinct_, later, now, waited_, queues, next_tail_id_, transfers);
    }

    // ---------------------------------------------------------------- accessors
    i64 scheduled() const { return scheduled_; }
    int num_devices() const { return nd_; }
    i64 evaluations() const { return evaluations_; }
    i64 copy_slots() const { return copy_slots_; }
    double last_time() const { return last_time_; }
    double cutoff_start() const { return cutoff_start_; }
    const std::vector<i64>& device() const { return device_; }
    const std::vector<double>& start() const { return start_; }
    const std::vector<double>& end() const { return end_; }
    const std::vector<i64>& order() const { return order_; }
    const std::vector<i64>& peak() const { return peak_; }
    const std::vector<i64>& preds_left() const { return preds_left_; }
    const std::vector<i64>& group_device() const { return group_device_; }
    // The transfers as a tuple of `cls` (schedule.Transfer, a frozen dataclass without slots),
    // made as its __init__ makes them: the fields set in the instance's __dict__, in order.
    py::tuple transfers(py::type cls) const {
        auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
        static const char* names[] = {"tensor", "src_device", "dst_device", "start_us", "end_us"};
        py::str keys[5];
        for (int k = 0; k < 5; ++k) keys[k] = py::str(names[k]);
        py::tuple out(transfers_.size());
        for (std::size_t i = 0; i < transfers_.size(); ++i) {
            const Transfer& t = transfers_[i];
            py::object obj = py::reinterpret_steal<py::object>(type->tp_alloc(type, 0));
            if (!obj) throw py::error_already_set();
            py::object dict = py::reinterpret_steal<py::object>(PyObject_GenericGetDict(obj.ptr(), nullptr));
            if (!dict) throw py::error_already_set();
            py::object values[5] = {py::int_(t.tensor), py::int_(t.src), py::int_(t.dst),
                                    py::float_(t.start), py::float_(t.end)};
            for (int k = 0; k < 5; ++k)
                if (PyDict_SetItem(dict.ptr(), keys[k].ptr(), values[k].ptr()) < 0) throw py::error_already_set();
            PyTuple_SET_ITEM(out.ptr(), i, obj.release().ptr());
        }
        return out;
    }
    // The bytes of copies a dry run of `op` on `dev` would receive (`ready_time`'s second value),
    // for `_stuck`: inputs whose producer is elsewhere (or nowhere yet) and not yet copied there.
    i64 ready_bytes(i64 op, int dev) const {
        i64 out = 0;
        for (i64 k = T_->in_ptr[op]; k < T_->in_ptr[op + 1]; ++k) {
            int pd = (int)device_[T_->in_src[k]];
            if (pd == dev) continue;
            if (arrival_of(T_->in_t[k], dev)) continue;
            if (pd < 0 || !links_->shares[(i64)pd * nd_ + dev] || T_->constant[T_->in_t[k]]) out += T_->in_bytes[k];
        }
        for (i64 k = T_->al_ptr[op]; k < T_->al_ptr[op + 1]; ++k)
            if (cut(T_->al_t[k], dev)) out += T_->tensor_bytes[T_->al_t[k]];
        return out;
    }
    i64 free_bytes(int dev) const {  // SchedulerState.free_bytes
        i64 out = capacity_[dev] - usage_[dev];
        for (const auto& p : pending_[dev]) out += p.nbytes;
        return out;
    }

    // ---------------------------------------------------------------- what m-SCT's policy reads
    // (sct_policy.hpp names each with the Python it stands for)
    i64 committed_ops() const { return (i64)order_.size(); }
    double dry_ready(i64 op, int dev) { return ready_time(op, dev, false).first; }
    double free_at(int dev) const { return device_free_[dev]; }
    double latest_free() const {  // Python's max(): the first of the largest
        double out = device_free_[0];
        for (double f : device_free_)
            if (f > out) out = f;
        return out;
    }
    i64 last_op_on(int dev) const { return last_op_[dev]; }
    i64 device_of(i64 op) const { return device_[op]; }
    i64 preds_left_of(i64 op) const { return preds_left_[op]; }
    i64 group_device_of(i64 op) const { return group_device_[group_of_[op]]; }
    bool group_fits(i64 op, int dev) const {
        return peak_[dev] + group_persistent_[group_of_[op]] <= persistent_cap_[dev];
    }
    const std::vector<int>& devices() const { return distinct_; }

   private:
    // ---------------------------------------------------------------- static
    PoolHolder pools_;  // first: destroyed after every reference into it
    std::shared_ptr<Tables> T_;
    i64 n_;
    int nd_;
    std::vector<i64> group_of_, group_persistent_, gm_ptr_, gm_op_, capacity_, persistent_cap_;
    std::shared_ptr<Links> links_;
    const double* slope_;  // links_'s, which this holds
    const double* intercept_;
    const double* latency_;
    double min_transfer_us_;
    bool fixed_, sct_;  // the policy: FixedPolicy, FavouriteChildPolicy, else EarliestStartPolicy
    std::vector<i64> device_of_;
    FavouriteChild<Scheduler> sct_policy_;  // its state, under FavouriteChildPolicy
    double cutoff_us_;
    bool queue_tails_, once_;

    // ---------------------------------------------------------------- SchedulerState
    std::vector<i64> tensor_consumers_left_, preds_left_, group_device_;
    std::vector<i64> device_;
    std::vector<double> start_, end_;
    std::vector<i64> order_;
    std::vector<double> device_free_;
    std::vector<i64> last_op_;
    std::vector<std::vector<double>> chan_start_, chan_end_;
    // SchedulerState.busy_start / busy_end: of each device that sends on its compute thread, its
    // runs of ops, back to back merged into one block
    std::vector<std::vector<double>> busy_start_, busy_end_;
    // SchedulerState.pair_lists: the bookings of two channels together, as trees of gap widths,
    // made when a copy between the two first looks for a slot; pair_index_ maps a * nd + b
    // (a < b) to its tree, pairs_of_ a device to the trees it is in, in the order they were made.
    std::vector<GapTreap> pair_trees_;
    std::unordered_map<i64, int> pair_index_;
    std::vector<std::vector<int>> pairs_of_;
    std::vector<i64> chan_version_;
    std::vector<std::vector<std::pair<int, Memo>>> ready_memo_;  // per memo_of op, (device, dry run)
    TailCopyPtr tail_copy_;
    std::vector<i64> usage_, peak_;
    std::vector<std::vector<Pending>> pending_;
    std::vector<std::vector<std::pair<int, double>>> arrival_;  // per tensor, (device, copy in)
    std::vector<std::vector<std::pair<int, double>>> release_;  // tensor -> (device, last use)
    struct Claim {
        int device;
        i64 holders;
        double when;
    };
    std::vector<std::vector<Claim>> claims_;  // SchedulerState.claims, per tensor
    std::vector<int> set_of_;
    std::vector<std::vector<int>> untouched_;
    std::vector<int> distinct_;
    std::vector<Transfer> transfers_;
    i64 copy_slots_ = 0;

    // ---------------------------------------------------------------- ListScheduler
    std::vector<std::vector<Later>> later_;
    std::vector<std::vector<Now>> now_;
    std::vector<OpSet> in_now_, dead_;
    std::vector<OpList> waiting_;
    // scratch of ready_time, tail_start and commit
    Extra extra_ready_, extra_tail_;
    std::vector<int> tail_sources_;
    std::vector<double> tail_widths_;
    std::vector<i64> seen_;
    std::vector<bool> waited_;
    std::vector<int> busy_;
    std::vector<bool> is_busy_;
    std::deque<TailQueue> tail_queues_;  // by id; dropped ones stay, not alive
    std::vector<i64> pool_of_;  // `pools`: per device, the id of its pool of held ops, or -1
    // `tail_ids`: per hash of (device, sources, widths), the ids of the live queues of such keys
    std::unordered_map<std::size_t, std::vector<i64>> tail_ids_;

    i64 find_queue(int device, const std::vector<int>& sources, const std::vector<double>& widths,
                   std::size_t h) const {
        auto it = tail_ids_.find(h);
        if (it == tail_ids_.end()) return -1;
        for (i64 qid : it->second) {
            const TailQueue& q = tail_queues_[qid];
            if (q.device == device && q.sources == sources && q.widths == widths) return qid;
        }
        return -1;
    }
    void index_queue(i64 qid) {  // tail_ids[(device, sources, widths)] = qid, for a new key
        const TailQueue& q = tail_queues_[qid];
        tail_ids_[queue_hash(q.device, q.sources, q.widths)].push_back(qid);
    }
    i64 next_tail_id_ = 0;
    TailCopyPtr tail_bound_;
    bool tail_bound_pool_ = false;  // tail_bound is (None, None, 0.0, start): held to the floor
    std::vector<std::pair<i64, int>> released_;  // scratch of step: the holds a commit lifted
    i64 replicated_ = 0;  // SchedulerState.replicated: replicas the last committing ready_time made
    // SchedulerState.recv_charge and send_charges: what the last committing ready_time's copies
    // take of the compute of the reader's device and of each sender that sends on compute
    struct SendCharge {
        int dev;
        double sent, hold;
    };
    double recv_charge_ = 0.0;
    std::vector<SendCharge> send_charges_;
    i64 scheduled_ = 0, evaluations_ = 0;
    std::tuple<i64, int, double> stepped_{-1, -1, 0.0};  // the (op, device, start) of the last step
    double last_time_ = 0.0;
    double cutoff_start_ = 0.0;

    const double* arrival_of(i64 t, int dev) const {
        for (const auto& a : arrival_[t])
            if (a.first == dev) return &a.second;
        return nullptr;
    }

    // ---------------------------------------------------------------- UntouchedTwins
    int stand_in(int dev) const {
        int k = set_of_[dev];
        if (k < 0) return -1;
        const auto& members = untouched_[k];
        return members[0] == dev && members.size() > 1 ? members[1] : -1;
    }

    void touch(int dev) {
        int k = set_of_[dev];
        if (k < 0) return;
        set_of_[dev] = -1;
        auto& members = untouched_[k];
        bool first = members[0] == dev;
        members.erase(std::find(members.begin(), members.end(), dev));
        if (!first) {
            distinct_.insert(distinct_.begin() + bisect_right(distinct_, dev), dev);
        } else if (!members.empty()) {
            int m = members[0];
            distinct_.insert(distinct_.begin() + bisect_right(distinct_, m), m);
        }
    }

    bool may_go(i64 op, int dev) const {  // dev in policy.devices(op, state)
        if (fixed_) return device_of_[op] == dev;
        std::size_t i = bisect_left(distinct_, dev);
        return i < distinct_.size() && distinct_[i] == dev;
    }

    // ---------------------------------------------------------------- channels
    void tentative(Extra& extra, int a, int b, double s, double e) const {  // _tentative
        if (e > s) {
            for (int d : {a, b}) {
                Extra::Lists* lists = extra.find(d);
                if (lists == nullptr) lists = extra.add(d);
                close_in(lists->starts, lists->ends, s, e, min_transfer_us_);
            }
        }
    }

    double slot(int a, int b, double t, double w, Extra& extra) {  // SchedulerState._slot
        if (w <= 0) return t;
        copy_slots_ += 1;
        const GapTreap& both = pair(a, b);
        const std::vector<double>* starts_of[2];
        const std::vector<double>* ends_of[2];
        int nl = 0;
        for (int d : {a, b}) {
            Extra::Lists* lists = extra.find(d);
            if (lists != nullptr) starts_of[nl] = &lists->starts, ends_of[nl++] = &lists->ends;
        }
        while (true) {
            double t0 = t;
            t = both.fit(t, w);  // the scan of the pair's list, in O(log n)
            for (int l = 0; l < nl; ++l) {
                const auto& starts = *starts_of[l];
                const auto& ends = *ends_of[l];
                std::size_t n = ends.size();
                if (n && ends[n - 1] > t) {
                    std::size_t i = bisect_right(ends, t);
                    while (i < n && starts[i] < t + w) {
                        t = ends[i];
                        i += 1;
                    }
                }
            }
            if (t == t0 || nl == 0) return t;
        }
    }

    // SchedulerState._send_slot
    double send_slot(int a, int b, double t, double w, Extra& extra) {
        if (!links_->sends_on_compute[a]) return slot(a, b, t, w, extra);
        while (true) {
            t = sender_idle(a, t);
            double s = slot(a, b, t, w, extra);
            if (s == t || sender_idle(a, s) == s) return s;
            t = s;
        }
    }

    double sender_idle(int dev, double t) const {  // SchedulerState._sender_idle
        const auto& starts = busy_start_[dev];
        std::size_t i = bisect_right(starts, t);
        if (i > 0 && busy_end_[dev][i - 1] > t) return busy_end_[dev][i - 1];
        return t;
    }

    void ran(int dev, double start, double end) {  // SchedulerState._ran
        chan_version_[dev] += 1;
        auto& starts = busy_start_[dev];
        auto& ends = busy_end_[dev];
        if (!ends.empty() && start <= ends.back()) {
            if (end > ends.back()) ends.back() = end;
        } else if (end > start) {
            starts.push_back(start);
            ends.push_back(end);
        }
    }

    const GapTreap& pair(int a, int b) {  // SchedulerState._pair
        if (a > b) std::swap(a, b);
        const i64 key = (i64)a * nd_ + b;
        auto found = pair_index_.find(key);
        if (found != pair_index_.end()) return pair_trees_[found->second];
        int id = (int)pair_trees_.size();
        pair_trees_.emplace_back();
        GapTreap& tree = pair_trees_.back();
        tree.from_lists(chan_start_[a], chan_end_[a]);
        for (std::size_t k = 0; k < chan_start_[b].size(); ++k) {
            tree.close_in(chan_start_[b][k], chan_end_[b][k], min_transfer_us_);
        }
        pair_index_.emplace(key, id);
        pairs_of_[a].push_back(id);
        if (b != a) pairs_of_[b].push_back(id);
        return tree;
    }

    void book(int dev, double s, double e) {  // SchedulerState._book
        chan_version_[dev] += 1;
        for (int id : pairs_of_[dev]) pair_trees_[id].close_in(s, e, min_transfer_us_);
        close_in(chan_start_[dev], chan_end_[dev], s, e, min_transfer_us_);
    }

    std::optional<double> channel_tail(int a, int b) const {  // SchedulerState.channel_tail
        const auto& ea = chan_end_[a];
        const auto& eb = chan_end_[b];
        if (!ea.empty() && !eb.empty()) return ea.back() > eb.back() ? ea.back() : eb.back();
        if (!ea.empty()) return ea.back();
        if (!eb.empty()) return eb.back();
        return std::nullopt;
    }

    // SchedulerState.tail_start
    std::optional<double> tail_start(const std::vector<int>& sources, const std::vector<double>& widths,
                                     int dev, double since) {
        Extra& extra = extra_tail_;
        extra.reset();
        double done = -kInf;
        for (std::size_t k = 0; k < sources.size(); ++k) {
            int a = sources[k];
            double w = widths[k];
            auto tail = channel_tail(a, dev);
            if (!tail || w <= 0) return std::nullopt;
            bool solid = false;
            for (int d : {a, dev}) {
                const auto& starts = chan_start_[d];
                const auto& ends = chan_end_[d];
                if (!starts.empty() && starts.back() <= since && ends.back() >= *tail) {
                    solid = true;
                    break;
                }
            }
            if (!solid) return std::nullopt;
            double s = send_slot(a, dev, *tail, w, extra);
            double arrived = s + w + latency_[(i64)a * nd_ + dev];
            tentative(extra, a, dev, s, s + w);
            done = std::max(done, arrived);
        }
        return done;
    }

    // ---------------------------------------------------------------- estimates

    struct Copy {
        int source;
        double w, start, arrived, sent;
    };
    std::vector<Copy> copies_;

    // SchedulerState._at_tail
    TailCopyPtr at_tail(const std::vector<Copy>& copies, int dev, double ready) {
        if (copies.empty()) return nullptr;
        auto& sources = tail_sources_;
        auto& widths = tail_widths_;
        sources.clear();
        widths.clear();
        double since = kInf, last = -kInf;
        for (const auto& c : copies) {
            auto tail = channel_tail(c.source, dev);
            if (tail && c.w > 0 && c.sent <= *tail && *tail <= c.start) {
                sources.push_back(c.source);
                widths.push_back(c.w);
                since = std::min(since, *tail);
                last = std::max(last, c.arrived);
            }
        }
        if (last != ready) return nullptr;
        TailCopy* out = pools_.pool->get();
        out->sources.assign(sources.begin(), sources.end());
        out->widths.assign(widths.begin(), widths.end());
        out->since = since;
        out->last = ready;
        return TailCopyPtr(out);
    }

    // SchedulerState.ready_time: (ready, bytes of copies still to receive)
    std::pair<double, i64> ready_time(i64 op, int dev, bool commit) {
        i64 key = 0, copied = 0;
        const i64 lo = T_->in_ptr[op], hi = T_->in_ptr[op + 1];
        const i64 memo_op = T_->memo_of[op];  // the dry runs of ops of the same inputs are one
        if (!commit) {
            key = chan_version_[dev];
            for (i64 k = lo; k < hi; ++k) key += chan_version_[device_[T_->in_src[k]]];
            for (const auto& [d, memo] : ready_memo_[memo_op]) {
                if (d == dev) {
                    if (memo.key == key) {
                        tail_copy_ = memo.tail;
                        return {memo.ready, memo.new_bytes};
                    }
                    break;
                }
            }
        }
        double ready = 0.0;
        Extra& extra = extra_ready_;
        extra.reset();
        i64 new_bytes = 0;
        replicated_ = 0;
        if (commit) {
            recv_charge_ = 0.0;
            send_charges_.clear();
        }
        auto& copies = copies_;
        copies.clear();
        for (i64 k = lo; k < hi; ++k) {
            i64 p = T_->in_src[k], t = T_->in_t[k], nbytes = T_->in_bytes[k];
            int pd = (int)device_[p];
            if (pd == dev) {
                if (end_[p] > ready) ready = end_[p];
                continue;
            }
            double arrived;
            const double* known = arrival_of(t, dev);
            if (known != nullptr) {
                arrived = *known;
            } else {
                double w = slope_[(i64)pd * nd_ + dev] * (double)nbytes + intercept_[(i64)pd * nd_ + dev];
                double s = send_slot(pd, dev, end_[p], w, extra);
                arrived = s + w + latency_[(i64)pd * nd_ + dev];
                const bool shared = links_->shares[(i64)pd * nd_ + dev];
                if (!shared || T_->constant[t]) {
                    new_bytes += nbytes;
                    if (commit && shared) replicated_ += nbytes;
                }
                if (!commit) copies.push_back({pd, w, s, arrived, end_[p]});
                tentative(extra, pd, dev, s, s + w);
                if (commit) {
                    arrival_[t].push_back({dev, arrived});
                    copied = 1;
                    if (links_->sends_on_compute[dev]) recv_charge_ += w;
                    if (links_->sends_on_compute[pd]) send_charges_.push_back({pd, s, w});
                    transfers_.push_back({t, pd, dev, s, arrived});
                    release_set_above(t, pd, arrived);
                }
            }
            if (arrived > ready) ready = arrived;
        }
        for (i64 k = T_->al_ptr[op]; k < T_->al_ptr[op + 1]; ++k)
            if (cut(T_->al_t[k], dev)) new_bytes += T_->tensor_bytes[T_->al_t[k]];
        if (commit) {
            for (const Extra::Lists& lists : extra)
                for (std::size_t k = 0; k < lists.starts.size(); ++k) book(lists.dev, lists.starts[k], lists.ends[k]);
            chan_version_[dev] += copied;
        } else {
            tail_copy_ = at_tail(copies, dev, ready);
            if (preds_left_[op] == 0) {
                Memo memo{key, ready, new_bytes, tail_copy_};
                bool found = false;
                for (auto& [d, old] : ready_memo_[memo_op]) {
                    if (d == dev) {
                        old = std::move(memo);
                        found = true;
                        break;
                    }
                }
                if (!found) ready_memo_[memo_op].push_back({dev, std::move(memo)});
            }
        }
        return {ready, new_bytes};
    }

    // rel = release.setdefault(t, {}); if rel.get(d, -1.0) < when: rel[d] = when
    void release_set_above(i64 t, int d, double when) {
        auto& rel = release_[t];
        for (auto& r : rel) {
            if (r.first == d) {
                if (r.second < when) r.second = when;
                return;
            }
        }
        if (-1.0 < when) rel.push_back({d, when});
    }

    // SchedulerState.memory_time
    std::optional<double> memory_time(int dev, i64 need, double t) const {
        i64 room = capacity_[dev] - usage_[dev];
        if (need <= room) return t;
        for (const auto& p : pending_[dev]) {
            room += p.nbytes;
            if (need <= room) return std::max(t, p.when);
        }
        return std::nullopt;
    }

    // ---------------------------------------------------------------- commit

    void apply_frees(int dev, double now) {
        auto& pending = pending_[dev];
        std::size_t k = 0;
        while (k < pending.size() && pending[k].when <= now) {
            usage_[dev] -= pending[k].nbytes;
            k += 1;
        }
        if (k) pending.erase(pending.begin(), pending.begin() + k);
    }

    void free_later(int dev, double when, i64 nbytes) {
        if (nbytes) {
            auto& pending = pending_[dev];
            Pending item{when, nbytes};
            pending.insert(pending.begin() + bisect_right(pending, item), item);
        }
    }

    // claims.setdefault((t, dev), [1, -1.0])
    Claim& claim_of(i64 t, int dev) {
        for (auto& c : claims_[t])
            if (c.device == dev) return c;
        claims_[t].push_back({dev, 1, -1.0});
        return claims_[t].back();
    }

    // SchedulerState._cut
    bool cut(i64 t, int dev) const { return !T_->always_reused[t] && handed_over(t, dev); }

    // SchedulerState._races
    bool races(i64 t, int dev) const {
        return T_->fallback[t] >= 0 && T_->always_reused[t] && handed_over(t, dev);
    }

    // SchedulerState._handed_over
    bool handed_over(i64 t, int dev) const {
        int home = (int)device_[T_->tensor_src[T_->tensor_alias[t]]];
        return home >= 0 && home != dev && links_->shares[(i64)home * nd_ + dev];
    }

    // SchedulerState._holder
    int holder(i64 t, int dev) const {
        int home = (int)device_[T_->tensor_src[t]];
        return links_->shares[(i64)home * nd_ + dev] ? home : dev;
    }

    // SchedulerState._release
    void release(i64 t, int dev, double when, std::vector<int>& freed) {
        while (true) {
            auto& cs = claims_[t];
            auto it = std::find_if(cs.begin(), cs.end(), [dev](const Claim& c) { return c.device == dev; });
            if (it != cs.end()) {
                it->holders -= 1;
                if (it->when < when) it->when = when;
                if (it->holders) return;
                when = it->when;
                cs.erase(it);
            }
            i64 source = T_->tensor_alias[t];
            if (source == kOwn || device_[T_->tensor_src[t]] != dev) {
                free_later(dev, when, T_->tensor_bytes[t]);
                freed.push_back(dev);
                return;
            }
            if (source == kHeldView) return;
            if (cut(t, dev)) {
                free_later(dev, when, T_->tensor_bytes[t]);
                freed.push_back(dev);
            } else if (races(t, dev)) {
                i64 fb = T_->fallback[t];
                release(fb, holder(fb, dev), when, freed);
            }
            dev = holder(source, dev);
            t = source;
        }
    }

    void place_group(i64 g, int dev) {
        touch(dev);
        group_device_[g] = dev;
        i64 p = group_persistent_[g];
        usage_[dev] += p;
        peak_[dev] += p;
    }

    std::vector<int> commit(i64 op, int dev, double start) {
        apply_frees(dev, start);
        i64 g = group_of_[op];
        if (group_device_[g] < 0) place_group(g, dev);
        auto [ready, new_bytes] = ready_time(op, dev, true);
        (void)ready;
        double end = start + T_->compute[op] + recv_charge_;
        touch(dev);
        device_[op] = dev;
        std::vector<std::pair<int, Memo>>().swap(ready_memo_[T_->memo_of[op]]);
        start_[op] = start;
        end_[op] = end;
        order_.push_back(op);
        device_free_[dev] = end;
        last_op_[dev] = op;
        if (links_->sends_on_compute[dev]) ran(dev, start, end);
        for (const SendCharge& c : send_charges_) {  // as SchedulerState.commit
            double at = std::max(c.sent, device_free_[c.dev]);
            device_free_[c.dev] = at + c.hold;
            ran(c.dev, at, at + c.hold);
        }
        usage_[dev] += T_->alloc[op] + new_bytes;
        peak_[dev] += replicated_;
        if (usage_[dev] > peak_[dev]) peak_[dev] = usage_[dev];
        std::vector<int> freed{dev};
        free_later(dev, end, T_->free_at_end[op]);
        for (i64 k = T_->al_ptr[op]; k < T_->al_ptr[op + 1]; ++k) {
            i64 t = T_->al_t[k], source = T_->tensor_alias[t];
            claim_of(source, holder(source, dev)).holders += 1;
            if (races(t, dev)) {
                i64 fb = T_->fallback[t];
                claim_of(fb, holder(fb, dev)).holders += 1;
            }
        }
        auto& seen = seen_;
        seen.clear();
        for (i64 k = T_->in_ptr[op]; k < T_->in_ptr[op + 1]; ++k) {
            i64 t = T_->in_t[k];
            if (std::find(seen.begin(), seen.end(), t) != seen.end()) continue;
            seen.push_back(t);
            release_set_above(t, holder(t, dev), end);
            tensor_consumers_left_[t] -= 1;
            if (tensor_consumers_left_[t] == 0) {
                auto rel = std::move(release_[t]);
                release_[t].clear();
                std::sort(rel.begin(), rel.end());
                for (auto& [d, when] : rel) release(t, d, std::max(when, start), freed);
            }
        }
        for (i64 k = T_->succ_ptr[op]; k < T_->succ_ptr[op + 1]; ++k) preds_left_[T_->succ[k]] -= 1;
        std::sort(freed.begin(), freed.end());
        freed.erase(std::unique(freed.begin(), freed.end()), freed.end());
        return freed;
    }

    // ---------------------------------------------------------------- candidates

    void push_ready(i64 op, double t) {
        i64 gdev = group_device_[group_of_[op]];
        Later item{t, T_->topo[op], op};
        if (gdev >= 0) {
            push((int)gdev, item);
        } else if (fixed_) {
            push((int)device_of_[op], item);
        } else {
            for (int d : distinct_) push(d, item);
        }
    }

    void push(int d, const Later& item) {  // ListScheduler._push
        heap_push(later_[d], item);
        wake(d);
    }

    void wake(int d) {
        if (!is_busy_[d]) {
            is_busy_[d] = true;
            busy_.insert(busy_.begin() + bisect_right(busy_, d), d);
        }
    }

    // ListScheduler.evaluate
    std::optional<double> evaluate(i64 op, int dev) {
        evaluations_ += 1;
        tail_bound_ = nullptr;
        tail_bound_pool_ = false;
        i64 g = group_of_[op];
        i64 gdev = group_device_[g];
        i64 need_persistent = 0;
        if (gdev < 0) {
            need_persistent = group_persistent_[g];
            if (peak_[dev] + need_persistent > persistent_cap_[dev]) {
                dead_[dev].add(op, n_);
                return std::nullopt;
            }
        } else if (gdev != dev) {
            dead_[dev].add(op, n_);
            return std::nullopt;
        }
        auto [ready, new_bytes] = ready_time(op, dev, false);
        TailCopyPtr copy = tail_copy_;  // this op's: m-SCT's hold makes dry runs of other ops
        double free = device_free_[dev];
        double base = ready > free ? ready : free;
        i64 need = T_->alloc[op] + new_bytes + need_persistent;
        auto t = memory_time(dev, need, base);
        if (!t || *t > base) {
            waiting_[dev].add(op, n_);
            waited_[dev] = true;
        }
        if (!t) return std::nullopt;
        double start = sct_ ? sct_policy_.hold(op, dev, *t, *this) : *t;  // the others hold nothing
        if (queue_tails_) {
            if (start == *t) {
                if (copy && start == copy->last) tail_bound_ = copy;
            } else {
                auto floor = sct_policy_.hold_floor(dev, *this);
                if (floor && start == floor->first) tail_bound_pool_ = true;
            }
        }
        return start;
    }

    TailQueue* queue_of(i64 qid) {
        if (qid < 0 || qid >= (i64)tail_queues_.size()) return nullptr;
        TailQueue* q = &tail_queues_[qid];
        return q->alive ? q : nullptr;
    }

    // ListScheduler.best
    std::optional<Choice> best(int d) {
        double free = device_free_[d];
        auto& h = later_[d];
        auto& p = now_[d];
        auto& in_p = in_now_[d];
        while (!h.empty() && h[0].key <= free) {
            Later top = h[0];
            if (top.op < 0) {
                TailQueue* queue = tail_entry(h, top.key, top.tp, top.op);
                if (queue != nullptr) {  // its members may start when the device is free
                    heap_pop(h);
                    queue->has_entry = true;
                    queue->entry_key = free;
                    queue->entry_tp = queue->members[0].tp;
                    queue->now = true;
                    heap_push(p, Now{queue->members[0].tp, top.op});
                }
                continue;
            }
            heap_pop(h);
            if (!once_ || !in_p.contains(top.op)) {
                in_p.add(top.op, n_);
                heap_push(p, Now{top.tp, top.op});
            }
        }
        while (!p.empty()) {
            Now top = p[0];
            if (top.op < 0) {
                TailQueue* queue = queue_of(-1 - top.op);
                if (queue == nullptr || !queue->now || queue->entry_tp != top.tp) {
                    heap_pop(p);  // an entry the queue no longer has
                    continue;
                }
                Member m = queue->pop();
                if (!queue->members.empty()) {
                    queue->entry_key = free;
                    queue->entry_tp = queue->members[0].tp;
                    heap_replace(p, Now{queue->entry_tp, top.op});
                } else {
                    heap_pop(p);
                    drop(-1 - top.op);
                }
                if (!once_ || !in_p.contains(m.op)) {
                    in_p.add(m.op, n_);
                    heap_push(p, Now{m.tp, m.op});
                }
                continue;
            }
            if (device_[top.op] >= 0 || dead_[d].contains(top.op)) {
                heap_pop(p);
                in_p.discard(top.op);
                continue;
            }
            auto v = evaluate(top.op, d);
            if (!v) {
                heap_pop(p);
                in_p.discard(top.op);
            } else if (*v > free) {
                heap_pop(p);
                in_p.discard(top.op);
                defer(h, d, top.tp, top.op, *v);
            } else {
                return Choice{*v, top.tp, d, top.op};
            }
        }
        while (!h.empty()) {
            Later top = h[0];
            if (top.op < 0) {
                TailQueue* queue = tail_entry(h, top.key, top.tp, top.op);
                if (queue != nullptr) {  // its first member may start at `key`: look at it alone
                    Member m = queue->pop();
                    if (device_[m.op] < 0 && !dead_[d].contains(m.op)) {
                        auto v = evaluate(m.op, d);
                        if (v) heap_push(h, Later{*v, m.tp, m.op});
                    }
                }
                continue;
            }
            if (device_[top.op] >= 0 || dead_[d].contains(top.op)) {
                heap_pop(h);
                continue;
            }
            auto v = evaluate(top.op, d);
            if (!v) {
                heap_pop(h);
            } else if (*v > top.key) {
                if (!tail_bound_ && !tail_bound_pool_) {
                    heap_replace(h, Later{*v, top.tp, top.op});
                } else {
                    heap_pop(h);
                    defer(h, d, top.tp, top.op, *v);
                }
            } else {
                return Choice{*v, top.tp, d, top.op};
            }
        }
        return std::nullopt;
    }

    // ListScheduler._hand_over
    void hand_over(int dev, int twin) {
        std::vector<i64> ids;
        for (const auto& e : later_[dev])
            if (e.op < 0) ids.push_back(e.op);
        for (const auto& e : now_[dev])
            if (e.op < 0) ids.push_back(e.op);
        for (i64 qid = 0; qid < (i64)tail_queues_.size(); ++qid)
            if (tail_queues_[qid].alive && tail_queues_[qid].device == dev) ids.push_back(-1 - qid);
        std::sort(ids.begin(), ids.end());
        ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
        std::unordered_map<i64, i64> fresh;
        for (auto it = ids.rbegin(); it != ids.rend(); ++it) {  // ascending queue ids
            i64 op = *it;
            i64 qid = fresh[op] = next_tail_id_++;
            TailQueue* queue = queue_of(-1 - op);
            tail_queues_.emplace_back();
            if (queue != nullptr && queue->device == dev) {
                TailQueue copy = *queue;
                copy.device = twin;
                tail_queues_[qid] = std::move(copy);
                if (tail_queues_[qid].pool) pool_of_[twin] = qid;
                else index_queue(qid);
            }
        }
        std::vector<Later> later;
        later.reserve(later_[dev].size());
        for (const auto& e : later_[dev]) later.push_back(Later{e.key, e.tp, e.op < 0 ? -1 - fresh[e.op] : e.op});
        later_[twin] = std::move(later);
        std::vector<Now> now;
        now.reserve(now_[dev].size());
        for (const auto& e : now_[dev]) now.push_back(Now{e.tp, e.op < 0 ? -1 - fresh[e.op] : e.op});
        now_[twin] = std::move(now);
        in_now_[twin] = in_now_[dev];
        waiting_[twin] = waiting_[dev];
        waited_[twin] = waited_[dev];
        dead_[twin].update(dead_[dev]);
        wake(twin);
    }

    void rest() {  // ListScheduler._rest
        std::vector<int> busy;
        for (int d : busy_) {
            if (!later_[d].empty() || !now_[d].empty()) busy.push_back(d);
            else is_busy_[d] = false;
        }
        busy_ = std::move(busy);
    }

    // ---------------------------------------------------------------- tail queues

    // ListScheduler._defer: into the tail queue of op's copy (`tail_bound_`), or into d's pool
    // when the policy held op to its floor (`tail_bound_pool_`).
    void defer(std::vector<Later>& h, int d, i64 tp, i64 op, double v) {
        TailCopyPtr copy = tail_bound_;
        const bool pool = tail_bound_pool_;
        if (!copy && !pool) {
            heap_push(h, Later{v, tp, op});
            return;
        }
        std::size_t qhash = pool ? 0 : queue_hash(d, copy->sources, copy->widths);
        i64 qid = pool ? pool_of_[d] : find_queue(d, copy->sources, copy->widths, qhash);
        const double since = pool ? 0.0 : copy->since;
        TailQueue* queue = qid >= 0 ? &tail_queues_[qid] : nullptr;
        if (queue != nullptr && queue->now) {
            auto bound = queue_bound(*queue);
            if (bound && *bound <= device_free_[d]) {
                heap_push(h, Later{v, tp, op});
                return;
            }
            if (bound) {
                double b = std::min(*bound, v);
                queue->now = false;
                queue->has_entry = true;
                queue->entry_key = b;
                queue->entry_tp = queue->members[0].tp;
                heap_push(h, Later{b, queue->members[0].tp, -1 - qid});
            } else {
                for (const auto& m : queue->members) {
                    if (!once_ || !in_now_[d].contains(m.op)) {
                        in_now_[d].add(m.op, n_);
                        heap_push(now_[d], Now{m.tp, m.op});
                    }
                }
                drop(qid);
                queue = nullptr;
            }
        }
        if (queue == nullptr) {
            qid = next_tail_id_++;
            tail_queues_.emplace_back();
            queue = &tail_queues_[qid];
            queue->alive = true;
            queue->device = d;
            queue->since = since;
            if (pool) {
                queue->pool = true;
                pool_of_[d] = qid;
            } else {
                queue->sources = copy->sources;
                queue->widths = copy->widths;
                tail_ids_[qhash].push_back(qid);
            }
        } else if (since < queue->since) {
            queue->since = since;
        }
        queue->push(Member{tp, op, v}, n_);
        if (!queue->has_entry || queue->entry_above(v, tp)) {
            queue->has_entry = true;
            queue->entry_key = v;
            queue->entry_tp = tp;
            heap_push(h, Later{v, tp, -1 - qid});
        }
    }

    // ListScheduler._tail_entry
    TailQueue* tail_entry(std::vector<Later>& h, double key, i64 tp, i64 op) {
        i64 qid = -1 - op;
        TailQueue* queue = queue_of(qid);
        if (queue == nullptr || queue->now || !queue->has_entry || queue->entry_key != key ||
            queue->entry_tp != tp) {
            heap_pop(h);
            return nullptr;
        }
        auto& members = queue->members;
        int d = queue->device;
        while (!members.empty() && (device_[members[0].op] >= 0 || dead_[d].contains(members[0].op)))
            queue->pop();
        if (members.empty()) {
            heap_pop(h);
            drop(qid);
            return nullptr;
        }
        auto start = queue_bound(*queue);
        if (!start) {
            heap_pop(h);
            std::vector<Member> left = std::move(members);
            // Each start they were queued with is still a lower bound, but for a pool's (held
            // under a reservation that may have ended): the device's free time is one.
            const bool pool = queue->pool;
            drop(qid);
            for (const auto& m : left)
                if (device_[m.op] < 0) heap_push(h, Later{pool ? device_free_[d] : m.start, m.tp, m.op});
            return nullptr;
        }
        double bkey = *start;
        i64 btp = members[0].tp;
        // bound > queue.entry, as tuples
        if (bkey != queue->entry_key ? bkey > queue->entry_key : btp > queue->entry_tp) {
            queue->entry_key = bkey;
            queue->entry_tp = btp;
            heap_replace(h, Later{bkey, btp, op});
            return nullptr;
        }
        return queue;
    }

    // ListScheduler._queue_bound: no member starts before this, if any. A pool's: the policy's
    // floor, unless the op exempt from it is a member; the device's free time while the policy
    // holds nothing back there.
    std::optional<double> queue_bound(const TailQueue& queue) {
        if (!queue.pool) return tail_start(queue.sources, queue.widths, queue.device, queue.since);
        auto floor = sct_policy_.hold_floor(queue.device, *this);
        if (!floor) return device_free_[queue.device];
        if (queue.ids.contains(floor->second)) return std::nullopt;
        return floor->first;
    }

    void drop(i64 qid) {  // ListScheduler._drop
        TailQueue& queue = tail_queues_[qid];
        if (queue.pool) {
            TailQueue& gone = tail_queues_[pool_of_[queue.device]];
            pool_of_[queue.device] = -1;
            gone.alive = false;
            std::vector<Member>().swap(gone.members);
            gone.ids = OpSet();
            return;
        }
        std::size_t h = queue_hash(queue.device, queue.sources, queue.widths);
        i64 found = find_queue(queue.device, queue.sources, queue.widths, h);
        auto& ids = tail_ids_[h];
        ids.erase(std::find(ids.begin(), ids.end(), found));
        if (ids.empty()) tail_ids_.erase(h);
        TailQueue& gone = tail_queues_[found];
        gone.alive = false;
        std::vector<Member>().swap(gone.members);
    }

    // ---------------------------------------------------------------- running

    // The part of ListScheduler.step after `policy.committed`: pools whose floor no longer
    // holds go down to their device's free time, and the ops the commit released are offered
    // again from it.
    void release_holds(i64 op, int dev) {
        released_.clear();
        sct_policy_.committed(op, dev, *this, released_);
        for (int d = 0; d < nd_; ++d) {  // `pools`, each on its own device's heap
            i64 qid = pool_of_[d];
            if (qid < 0) continue;
            TailQueue& pool = tail_queues_[qid];
            double free = device_free_[d];
            if (!pool.now && pool.entry_key > free && !sct_policy_.hold_floor(d, *this)) {
                // Its floor no longer holds: its entry goes down to the device's free time, a
                // lower bound of every start there, once for all its members.
                pool.entry_key = free;
                push(d, Later{free, pool.entry_tp, -1 - qid});
            }
        }
        for (const auto& [w, d] : released_) {
            i64 qid = pool_of_[d];
            if (qid >= 0 && tail_queues_[qid].ids.contains(w)) continue;  // its pool went down
            if (device_[w] < 0) push(d, Later{device_free_[d], T_->topo[w], w});
        }
    }

    int step() {  // ListScheduler.step
        std::optional<Choice> choice;
        bool idle = false;
        for (int d : busy_) {
            if (later_[d].empty() && now_[d].empty()) {
                idle = true;
                continue;
            }
            auto c = best(d);
            if (c && (!choice || *c < *choice)) choice = c;
        }
        if (idle) rest();
        if (!choice) return kNoChoice;
        double t = choice->start;
        int dev = (int)choice->dev;
        i64 op = choice->op;
        stepped_ = {op, dev, t};
        if (t > cutoff_us_) {
            cutoff_start_ = t;
            return kCutOff;
        }
        i64 g = group_of_[op];
        bool first_of_group = group_device_[g] < 0;
        std::size_t copies = transfers_.size();
        int twin = stand_in(dev);
        if (twin >= 0) hand_over(dev, twin);
        std::vector<int> newly_free = commit(op, dev, t);
        for (std::size_t k = copies; k < transfers_.size(); ++k) {
            const Transfer tr = transfers_[k];
            int to = tr.dst;
            for (i64 r = T_->rd_ptr[tr.tensor]; r < T_->rd_ptr[tr.tensor + 1]; ++r) {
                i64 w = T_->rd_op[r];
                if (device_[w] < 0 && preds_left_[w] == 0) {
                    i64 gdev = group_device_[group_of_[w]];
                    if (gdev == to || (gdev < 0 && may_go(w, to))) push(to, Later{t, T_->topo[w], w});
                }
            }
        }
        scheduled_ += 1;
        last_time_ = t;
        if (sct_) release_holds(op, dev);
        for (int d : newly_free) {
            double free = device_free_[d];
            for (i64 w : waiting_[d].items())
                if (device_[w] < 0) push(d, Later{free, T_->topo[w], w});
            waiting_[d].clear();
        }
        for (i64 k = T_->succ_ptr[op]; k < T_->succ_ptr[op + 1]; ++k) {
            i64 s = T_->succ[k];
            if (preds_left_[s] == 0) push_ready(s, t);
        }
        if (first_of_group && gm_ptr_[g + 1] - gm_ptr_[g] > 1) {
            for (i64 k = gm_ptr_[g]; k < gm_ptr_[g + 1]; ++k) {
                i64 m = gm_op_[k];
                if (device_[m] < 0 && preds_left_[m] == 0) {
                    dead_[dev].discard(m);
                    push(dev, Later{t, T_->topo[m], m});
                }
            }
        }
        return kGoOn;
    }
};

template <class T>
py::array_t<T> as_array(const std::vector<T>& v) {
    return py::array_t<T>(v.size(), v.data());
}

// windows.balance_windows on the compiled engine (`native/windows.hpp`): the arguments are
// `_native_windows`' arrays; returns (device of each op, op moves evaluated).
using I32Array = py::array_t<std::int32_t, py::array::c_style | py::array::forcecast>;

py::tuple balance_windows(int num_devices, int num_windows, bool overlap, F64Array compute,
                          I32Array device_of, I32Array window, F64Array slope, F64Array intercept,
                          I64Array tbytes, I32Array tsrc, I64Array ins_ptr, I32Array ins,
                          I64Array outs_ptr, I32Array outs, I64Array cons_ptr, I32Array cons,
                          I64Array members_ptr, I32Array members, I64Array group_persistent,
                          I64Array on_device, I64Array room, I32Array orders, i64 passes,
                          i64 num_movable, int targets, i64 per_move, i64 max_moves,
                          double min_pass_gain) {
    baechi::WindowProblem p{num_devices, num_windows, overlap, compute.data(), window.data(),
                            slope.data(), intercept.data(), tbytes.data(), tsrc.data(),
                            (i64)compute.size(), (i64)tsrc.size(),
                            {ins_ptr.data(), ins.data()}, {outs_ptr.data(), outs.data()},
                            {cons_ptr.data(), cons.data()}};
    std::vector<int> dev(device_of.data(), device_of.data() + device_of.size());
    baechi::WindowSearch search{{members_ptr.data(), members.data()}, group_persistent.data(),
                                std::vector<i64>(on_device.data(), on_device.data() + on_device.size()),
                                room.data(), orders.data(), passes, num_movable, targets, per_move,
                                max_moves, min_pass_gain};
    i64 evaluated;
    std::vector<int> placed;
    {
        py::gil_scoped_release released;
        baechi::WindowLoads loads(p, std::move(dev));
        evaluated = baechi::balance(loads, search);
        placed = loads.devices();
    }
    py::array_t<std::int32_t> out((py::ssize_t)placed.size());
    std::copy(placed.begin(), placed.end(), out.mutable_data());
    return py::make_tuple(out, evaluated);
}

// memory_timeline._chained_bounds on the compiled engine: per op, the earliest and the latest
// place it may take in its group's order, `window[v]` places from its own at most. `order` is a
// topological order; `out_ptr`/`out_dst` and `in_ptr`/`in_src` the successors and predecessors of
// each op in CSR form. O((V + E) G).
py::tuple chained_bounds(int groups, I64Array order, I64Array out_ptr, I64Array out_dst,
                         I64Array in_ptr, I64Array in_src, I64Array group_of, I64Array place,
                         I64Array window, I64Array last) {
    const i64 n = (i64)order.size();
    const i64* ord = order.data();
    const i64* optr = out_ptr.data();
    const i64* odst = out_dst.data();
    const i64* iptr = in_ptr.data();
    const i64* isrc = in_src.data();
    const i64* grp = group_of.data();
    const i64* plc = place.data();
    const i64* win = window.data();
    const i64* lst = last.data();
    py::array_t<i64> lo_out((py::ssize_t)n), hi_out((py::ssize_t)n);
    i64* lo = lo_out.mutable_data();
    i64* hi = hi_out.mutable_data();
    {
        py::gil_scoped_release release;
        // after[v * G + g]: one past the latest earliest place of v's ancestors in g;
        // before[v * G + g]: one short of the earliest latest place of its descendants in g.
        std::vector<i64> after((size_t)(n * groups), 0), before((size_t)(n * groups), n);
        std::vector<i64> carried((size_t)groups);
        for (i64 k = 0; k < n; ++k) {
            const i64 v = ord[k];
            i64* row = &after[(size_t)(v * groups)];
            lo[v] = std::min(std::max(plc[v] - win[v], row[grp[v]]), plc[v]);
            std::copy(row, row + groups, carried.begin());
            carried[grp[v]] = std::max(carried[grp[v]], lo[v] + 1);
            for (i64 e = optr[v]; e < optr[v + 1]; ++e) {
                i64* to = &after[(size_t)(odst[e] * groups)];
                for (int g = 0; g < groups; ++g) to[g] = std::max(to[g], carried[g]);
            }
        }
        for (i64 k = n - 1; k >= 0; --k) {
            const i64 v = ord[k];
            i64* row = &before[(size_t)(v * groups)];
            const i64 bound = std::min(std::min(plc[v] + win[v], row[grp[v]]), lst[v]);
            hi[v] = std::max(bound, plc[v]);
            std::copy(row, row + groups, carried.begin());
            carried[grp[v]] = std::min(carried[grp[v]], hi[v] - 1);
            for (i64 e = iptr[v]; e < iptr[v + 1]; ++e) {
                i64* to = &before[(size_t)(isrc[e] * groups)];
                for (int g = 0; g < groups; ++g) to[g] = std::min(to[g], carried[g]);
            }
        }
    }
    return py::make_tuple(lo_out, hi_out);
}

// order_bounds.timed_bounds on the compiled engine: per op, its earliest start carried forward
// along every edge by its predecessors' durations, and its latest end carried backward by its
// successors'. `order` is a topological order; `out_ptr`/`out_dst` the distinct successors of each
// op in CSR form (`OpGraph.successor_rows`). O(V + E).
py::tuple timed_bounds(I64Array order, I64Array out_ptr, I64Array out_dst, F64Array earliest_start,
                       F64Array latest_end, F64Array duration) {
    const i64 n = (i64)order.size();
    const i64* ord = order.data();
    const i64* optr = out_ptr.data();
    const i64* odst = out_dst.data();
    const double* took = duration.data();
    py::array_t<double> starts_out((py::ssize_t)n), ends_out((py::ssize_t)n);
    double* starts = starts_out.mutable_data();
    double* ends = ends_out.mutable_data();
    std::copy(earliest_start.data(), earliest_start.data() + n, starts);
    std::copy(latest_end.data(), latest_end.data() + n, ends);
    {
        py::gil_scoped_release release;
        for (i64 k = 0; k < n; ++k) {  // an op's start is final once its predecessors are done
            const i64 v = ord[k];
            const double ready = starts[v] + took[v];
            for (i64 e = optr[v]; e < optr[v + 1]; ++e) starts[odst[e]] = std::max(starts[odst[e]], ready);
        }
        for (i64 k = n - 1; k >= 0; --k) {
            const i64 v = ord[k];
            for (i64 e = optr[v]; e < optr[v + 1]; ++e) ends[v] = std::min(ends[v], ends[odst[e]] - took[odst[e]]);
        }
    }
    return py::make_tuple(starts_out, ends_out);
}

// executor_order.emulated_times on the compiled engine (native/executor.hpp).
py::tuple emulated_times(I64Array succ_ptr, I64Array succ, I64Array dev, I64Array pool, I64Array inline_op,
                         F64Array took, I64Array size, F64Array draws) {
    const i64 n = (i64)dev.size();
    std::vector<i64> sizes(size.data(), size.data() + size.size());
    baechi::EmulatedStep step;
    {
        py::gil_scoped_release release;
        step = baechi::emulate_step(n, succ_ptr.data(), succ.data(), dev.data(), pool.data(), inline_op.data(),
                                    took.data(), sizes, draws.data(), (i64)draws.size());
    }
    return py::make_tuple(as_array(step.start), as_array(step.end));
}

}  // namespace

PYBIND11_MODULE(_native, m) {
    m.doc() = "The compiled engine of baechi_tf's list scheduler (see list_scheduler.py).";
    // Bumped whenever the interface with list_scheduler.py changes: engine.py refuses a module
    // of another version (a stale build left in the source tree by a failed rebuild).
    m.attr("INTERFACE") = 18;
    py::class_<Tables, std::shared_ptr<Tables>>(m, "Tables")
        .def(py::init<i64, i64, F64Array, I64Array, I64Array, I64Array, I64Array, I64Array, I64Array,
                      I64Array, I64Array, I64Array, I64Array, I64Array, I64Array, I64Array, I64Array,
                      I64Array, I64Array, I64Array, I64Array, I64Array, I64Array, I64Array, I64Array>());
    py::class_<Links, std::shared_ptr<Links>>(m, "Links")
        .def(py::init<F64Array, F64Array, F64Array, const std::vector<bool>&, const std::vector<bool>&>());
    m.def("balance_windows", &balance_windows);
    m.def("chained_bounds", &chained_bounds);
    m.def("emulated_times", &emulated_times);
    m.def("timed_bounds", &timed_bounds);
    // The channels' tree alone, for tests against `_close_in` and `_slot`'s scan.
    py::class_<GapTreap>(m, "GapTreap")
        .def(py::init<>())
        .def("close_in", &GapTreap::close_in)
        .def("fit", &GapTreap::fit)
        .def("lists", [](const GapTreap& tree) {
            std::vector<double> starts, ends;
            tree.to_lists(starts, ends);
            return py::make_tuple(starts, ends);
        });
    py::class_<Scheduler, std::shared_ptr<Scheduler>>(m, "Scheduler")
        .def(py::init<std::shared_ptr<Tables>, int, I64Array, I64Array, I64Array, I64Array, I64Array,
                      I64Array, std::shared_ptr<Links>, double, int, I64Array, I64Array, I64Array,
                      std::vector<std::vector<int>>, std::vector<int>, std::vector<std::pair<i64, int>>,
                      I64Array, double, bool, bool>())
        .def("run", &Scheduler::run, py::arg("max_steps"), py::arg("max_evaluations"),
             py::call_guard<py::gil_scoped_release>())
        .def("step", &Scheduler::step_one)
        .def("snapshot", &Scheduler::snapshot)
        .def("fingerprint", &Scheduler::fingerprint)
        .def("restore", &Scheduler::restore)
        .def("patched", &Scheduler::patched)
        .def("waited", [](const Scheduler& s) {
            std::vector<bool> out;
            for (int d = 0; d < s.num_devices(); ++d) out.push_back(s.waited(d));
            return out;
        })
        .def_property_readonly("scheduled", &Scheduler::scheduled)
        .def_property_readonly("evaluations", &Scheduler::evaluations)
        .def_property_readonly("copy_slots", &Scheduler::copy_slots)
        .def_property_readonly("last_time", &Scheduler::last_time)
        .def_property_readonly("cutoff_start", &Scheduler::cutoff_start)
        .def("device", [](const Scheduler& s) { return as_array(s.device()); })
        .def("start", [](const Scheduler& s) { return as_array(s.start()); })
        .def("end", [](const Scheduler& s) { return as_array(s.end()); })
        .def("order", [](const Scheduler& s) { return as_array(s.order()); })
        .def("peak", [](const Scheduler& s) { return s.peak(); })
        .def("preds_left", [](const Scheduler& s) { return as_array(s.preds_left()); })
        .def("group_device", [](const Scheduler& s) { return as_array(s.group_device()); })
        .def("transfers", &Scheduler::transfers, py::arg("cls"))
        .def("ready_bytes", &Scheduler::ready_bytes)
        .def("free_bytes", &Scheduler::free_bytes);
}
