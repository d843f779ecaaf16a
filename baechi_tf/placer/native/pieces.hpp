// The plain parts of the compiled list scheduler (scheduler.cpp), each a port of a piece of
// baechi_tf/placer/list_scheduler.py or of the Python it leans on:
//
//   bisect_left, bisect_right, heap_push, heap_pop, heap_replace   Python's bisect and heapq,
//       algorithm for algorithm (the same probes, the same sift steps), so that a heap holds its
//       entries in the Python engine's order and ties break as tuple comparison breaks them;
//   Later, Now, Member, Choice, Pending      the tuples the scheduler keeps in heaps and lists,
//       ordered as Python orders the tuples;
//   TailCopy, TailPool, TailCopyPtr          `SchedulerState.tail_copy`, counted and pooled;
//   Memo, Transfer                           a remembered dry run, a booked copy;
//   OpSet, OpList                            a device's set of ops (a bitmap), and one in order;
//   TailQueue, queue_hash                    `TailQueue` (pools included) and its key's hash;
//   close_in, Extra                          `_close_in` (bookings merged across gaps no copy
//       takes), and a dry run's tentative bookings per device.
//
// None reads the scheduler; each costs what its Python original costs, but for OpSet's O(1).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

namespace baechi {

using i64 = std::int64_t;
constexpr double kInf = std::numeric_limits<double>::infinity();

// ------------------------------------------------------------------ Python's bisect and heapq

template <class V, class T>
std::size_t bisect_right(const V& a, const T& x) {
    std::size_t lo = 0, hi = a.size();
    while (lo < hi) {
        std::size_t mid = (lo + hi) / 2;
        if (x < a[mid]) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

template <class V, class T>
std::size_t bisect_left(const V& a, const T& x) {
    std::size_t lo = 0, hi = a.size();
    while (lo < hi) {
        std::size_t mid = (lo + hi) / 2;
        if (a[mid] < x) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

template <class T>
void sift_down(std::vector<T>& heap, std::size_t startpos, std::size_t pos) {  // heapq._siftdown
    T item = heap[pos];
    while (pos > startpos) {
        std::size_t parentpos = (pos - 1) >> 1;
        if (item < heap[parentpos]) {
            heap[pos] = heap[parentpos];
            pos = parentpos;
            continue;
        }
        break;
    }
    heap[pos] = item;
}

template <class T>
void sift_up(std::vector<T>& heap, std::size_t pos) {  // heapq._siftup
    std::size_t endpos = heap.size(), startpos = pos;
    T item = heap[pos];
    std::size_t childpos = 2 * pos + 1;
    while (childpos < endpos) {
        std::size_t rightpos = childpos + 1;
        if (rightpos < endpos && !(heap[childpos] < heap[rightpos])) childpos = rightpos;
        heap[pos] = heap[childpos];
        pos = childpos;
        childpos = 2 * pos + 1;
    }
    heap[pos] = item;
    sift_down(heap, startpos, pos);
}

template <class T>
void heap_push(std::vector<T>& heap, const T& item) {
    heap.push_back(item);
    sift_down(heap, 0, heap.size() - 1);
}

template <class T>
T heap_pop(std::vector<T>& heap) {
    T last = heap.back();
    heap.pop_back();
    if (!heap.empty()) {
        T out = heap[0];
        heap[0] = last;
        sift_up(heap, 0);
        return out;
    }
    return last;
}

template <class T>
void heap_replace(std::vector<T>& heap, const T& item) {
    heap[0] = item;
    sift_up(heap, 0);
}

// ------------------------------------------------------------------ entries

// Python's tuple comparison of (x, ...) with (y, ...), given pair by pair: the first pair that
// differs (!=) decides, by <.
template <class T>
bool tuple_less(const T& x, const T& y) {
    return x < y;
}
template <class T, class... Rest>
bool tuple_less(const T& x, const T& y, const Rest&... rest) {
    if (x != y) return x < y;
    return tuple_less(rest...);
}

struct Later {  // (lower bound of start, topo, op); op < 0 stands for tail queue -1 - op
    double key;
    i64 tp;
    i64 op;
};
inline bool operator<(const Later& a, const Later& b) {
    return tuple_less(a.key, b.key, a.tp, b.tp, a.op, b.op);
}

struct Now {  // (topo, op)
    i64 tp;
    i64 op;
};
inline bool operator<(const Now& a, const Now& b) { return tuple_less(a.tp, b.tp, a.op, b.op); }

struct Member {  // (topo, op, start when queued)
    i64 tp;
    i64 op;
    double start;
};
inline bool operator<(const Member& a, const Member& b) {
    return tuple_less(a.tp, b.tp, a.op, b.op, a.start, b.start);
}

struct Choice {  // (start, topo, device, op)
    double start;
    i64 tp;
    i64 dev;
    i64 op;
};
inline bool operator<(const Choice& a, const Choice& b) {
    return tuple_less(a.start, b.start, a.tp, b.tp, a.dev, b.dev, a.op, b.op);
}

struct Pending {  // (when, bytes), sorted
    double when;
    i64 nbytes;
};
inline bool operator<(const Pending& a, const Pending& b) {
    return tuple_less(a.when, b.when, a.nbytes, b.nbytes);
}

// `SchedulerState.tail_copy`: (source devices, widths, since, last arrival). Immutable once
// made; counted references (`TailCopyPtr`, single-threaded), and a scheduler's pool reuses
// those no dry run remembers any more, lists and all: a dry run allocates nothing.
struct TailPool;
struct TailCopy {
    std::vector<int> sources;
    std::vector<double> widths;
    double since = 0.0;
    double last = 0.0;
    int refs = 0;
    TailPool* pool = nullptr;
};

struct TailPool {
    std::vector<std::unique_ptr<TailCopy>> all;
    std::vector<TailCopy*> spare;
    TailCopy* get() {
        if (spare.empty()) {
            all.push_back(std::make_unique<TailCopy>());
            all.back()->pool = this;
            return all.back().get();
        }
        TailCopy* out = spare.back();
        spare.pop_back();
        return out;
    }
};

class TailCopyPtr {
   public:
    TailCopyPtr() = default;
    TailCopyPtr(std::nullptr_t) {}
    explicit TailCopyPtr(TailCopy* p) : p_(p) { ++p_->refs; }
    TailCopyPtr(const TailCopyPtr& o) : p_(o.p_) {
        if (p_) ++p_->refs;
    }
    TailCopyPtr(TailCopyPtr&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
    TailCopyPtr& operator=(const TailCopyPtr& o) {
        if (o.p_) ++o.p_->refs;
        release();
        p_ = o.p_;
        return *this;
    }
    TailCopyPtr& operator=(TailCopyPtr&& o) noexcept {
        if (this != &o) {
            release();
            p_ = o.p_;
            o.p_ = nullptr;
        }
        return *this;
    }
    TailCopyPtr& operator=(std::nullptr_t) {
        release();
        return *this;
    }
    ~TailCopyPtr() { release(); }
    const TailCopy* operator->() const { return p_; }
    explicit operator bool() const { return p_ != nullptr; }
    bool operator!() const { return p_ == nullptr; }

   private:
    void release() {
        if (p_ && --p_->refs == 0) p_->pool->spare.push_back(p_);
        p_ = nullptr;
    }
    TailCopy* p_ = nullptr;
};

// A scheduler's own pool: a copy of the scheduler (a snapshot) gets a new one, and assigning a
// snapshot to a scheduler keeps the scheduler's (snapshots hold no references into pools).
struct PoolHolder {
    std::unique_ptr<TailPool> pool = std::make_unique<TailPool>();
    PoolHolder() = default;
    PoolHolder(const PoolHolder&) : pool(std::make_unique<TailPool>()) {}
    PoolHolder& operator=(const PoolHolder&) { return *this; }
};

struct Memo {
    i64 key;
    double ready;
    i64 new_bytes;
    TailCopyPtr tail;
};

struct Transfer {
    i64 tensor;
    int src, dst;
    double start, end;
};

// The key of `tail_ids`, (device, sources, widths), hashed: equal keys hash alike (widths are
// positive, so no -0.0 stands for 0.0).
inline std::size_t queue_hash(int device, const std::vector<int>& sources, const std::vector<double>& widths) {
    std::size_t h = std::hash<int>()(device);
    auto mix = [&h](std::size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
    for (int s : sources) mix(std::hash<int>()(s));
    for (double w : widths) mix(std::hash<double>()(w));
    return h;
}

// A device's set of ops (`in_now`, `dead`): a bitmap, allocated when the first op goes in.
class OpSet {
   public:
    bool contains(i64 op) const {
        std::size_t w = (std::size_t)op >> 6;
        return w < bits_.size() && (bits_[w] >> (op & 63) & 1);
    }
    void add(i64 op, i64 n) {
        if (bits_.empty()) bits_.assign(((std::size_t)n + 63) >> 6, 0);
        bits_[(std::size_t)op >> 6] |= std::uint64_t(1) << (op & 63);
    }
    void discard(i64 op) {
        std::size_t w = (std::size_t)op >> 6;
        if (w < bits_.size()) bits_[w] &= ~(std::uint64_t(1) << (op & 63));
    }
    void update(const OpSet& other) {
        if (other.bits_.empty()) return;
        if (bits_.empty()) bits_.assign(other.bits_.size(), 0);
        for (std::size_t w = 0; w < bits_.size(); ++w) bits_[w] |= other.bits_[w];
    }

   private:
    std::vector<std::uint64_t> bits_;
};

// A device's `waiting` set: its ops in the order they came (a set's order is no schedule's
// concern: each is pushed with its own key), each once.
class OpList {
   public:
    void add(i64 op, i64 n) {
        if (!in_.contains(op)) {
            in_.add(op, n);
            list_.push_back(op);
        }
    }
    void clear() {
        for (i64 op : list_) in_.discard(op);
        list_.clear();
    }
    const std::vector<i64>& items() const { return list_; }

   private:
    OpSet in_;
    std::vector<i64> list_;
};

struct TailQueue {  // `TailQueue`
    bool alive = false;
    bool pool = false;  // its members are ops held to the policy's floor (no sources, no widths)
    int device = -1;
    std::vector<int> sources;
    std::vector<double> widths;
    double since = 0.0;
    std::vector<Member> members;
    OpSet ids;  // a pool's members (an op is one at most once)
    bool has_entry = false;
    double entry_key = 0.0;
    i64 entry_tp = 0;
    bool now = false;

    // (v, tp) < entry, as tuples
    bool entry_above(double v, i64 tp) const {
        if (v != entry_key) return v < entry_key;
        return tp < entry_tp;
    }
    void push(const Member& m, i64 n) {
        if (pool) {
            if (ids.contains(m.op)) return;
            ids.add(m.op, n);
        }
        heap_push(members, m);
    }
    Member pop() {
        Member out = heap_pop(members);
        ids.discard(out.op);
        return out;
    }
};

// _close_in: books [s, e) in the sorted, disjoint bookings (starts, ends), merged with the
// bookings closer than `gap` (the shortest transfer), a gap no transfer can take. Python deletes
// the merged entries one by one; here [i, j) are the entries merged, replaced at once.
inline void close_in(std::vector<double>& starts, std::vector<double>& ends, double s, double e, double gap) {
    std::size_t i = bisect_left(starts, s);
    std::size_t j = i;
    if (i > 0 && ends[i - 1] + gap > s) {
        i -= 1;
        s = starts[i];
        e = std::max(e, ends[i]);
        j = i + 1;
    }
    while (j < starts.size() && starts[j] < e + gap) {
        e = std::max(e, ends[j]);
        ++j;
    }
    if (j == i) {
        starts.insert(starts.begin() + i, s);
        ends.insert(ends.begin() + i, e);
    } else {
        starts[i] = s;
        ends[i] = e;
        if (j > i + 1) {
            starts.erase(starts.begin() + i + 1, starts.begin() + j);
            ends.erase(ends.begin() + i + 1, ends.begin() + j);
        }
    }
}

// A dry run's tentative bookings per device (`extra` of `ready_time`), kept between runs so
// that their lists are not allocated again.
class Extra {
   public:
    struct Lists {
        int dev;
        std::vector<double> starts, ends;
    };
    void reset() {
        for (std::size_t k = 0; k < used_; ++k) lists_[k].starts.clear(), lists_[k].ends.clear();
        used_ = 0;
    }
    Lists* find(int d) {
        for (std::size_t k = 0; k < used_; ++k)
            if (lists_[k].dev == d) return &lists_[k];
        return nullptr;
    }
    Lists* add(int d) {
        if (used_ == lists_.size()) lists_.emplace_back();
        Lists* out = &lists_[used_++];
        out->dev = d;
        return out;
    }
    Lists* begin() { return lists_.data(); }
    Lists* end() { return lists_.data() + used_; }

   private:
    std::vector<Lists> lists_;
    std::size_t used_ = 0;
};

}  // namespace baechi
