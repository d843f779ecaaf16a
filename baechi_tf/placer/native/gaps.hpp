// Bookings of a channel (or of two channels together) as a treap of disjoint intervals, ordered
// by start, each node knowing the gap to the next booking and the widest gap of its subtree.
//
// It answers exactly what `scheduler_state._close_in` and the scan in `SchedulerState._slot` answer
// on sorted lists, with the same float comparisons, but in O(log n) expected time per booking and
// per search instead of a walk over every gap too narrow for the copy:
//
//   close_in(s, e, gap)  books [s, e), merged with the bookings closer than `gap`;
//   fit(t, w)            the earliest start >= t at which [start, start + w) meets no booking, by
//                        the scan's rule: step to the end of each booking that starts before
//                        t + w and ends after t, until one does not.
//
// The widest-gap pruning compares widths computed by subtraction, which may round; it only
// discards subtrees whose widest gap is narrower than w by more than the rounding can explain,
// and each gap it does not discard is tested by the scan's own comparison (end + w <= next
// start), so the answer is the scan's to the last bit.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace baechi {

class GapTreap {
 public:
    GapTreap() = default;

    bool empty() const { return root_ < 0; }
    int size() const { return size_; }
    // The end of the last booking; only when not empty.
    double last_end() const { return last_end_; }

    // Books [s, e), merged with the bookings closer than `gap` (`_close_in`).
    void close_in(double s, double e, double gap) {
        if (root_ >= 0 && node_[last_].start < s) {  // after every booking's start: the usual case
            append(s, e, gap);
            return;
        }
        // pred: the last booking starting before s (bisect_left), merged when it ends within gap.
        int left, right;
        split_before(root_, s, left, right);  // left: starts < s; right: starts >= s
        if (left >= 0) {
            int last = rightmost(left);
            if (node_[last].end + gap > s) {
                int rest;
                split_before(left, node_[last].start, left, rest);  // rest holds `last` alone
                s = node_[last].start;
                e = std::max(e, node_[last].end);
                release(rest);
            }
        }
        // Followers starting before e + gap merge, e growing as they do.
        while (right >= 0) {
            int first = leftmost(right);
            if (!(node_[first].start < e + gap)) break;
            e = std::max(e, node_[first].end);
            int rest;
            split_after_first(right, rest);  // drops `first`
            release_one(first);
            right = rest;
        }
        int n = make(s, e);
        root_ = join(join(left, n), right);
        fix_gaps_around(n);
        last_ = rightmost(root_);
    }

    // The scan of `_slot` on this list alone.
    double fit(double t, double w) const {
        if (root_ < 0 || !(last_end_ > t)) return t;
        int i = first_ending_after(t);  // bisect_right(ends, t)
        if (!(node_[i].start < t + w)) return t;
        // From i on, the first booking j after which the next starts no earlier than end + w.
        int j = first_fitting_from(i, w);
        return node_[j].end;
    }

    // The bookings in order, for snapshots and tests.
    void to_lists(std::vector<double>& starts, std::vector<double>& ends) const {
        std::vector<int> order;
        in_order(order);
        starts.clear();
        ends.clear();
        for (int n : order) {
            starts.push_back(node_[n].start);
            ends.push_back(node_[n].end);
        }
    }

    // Rebuilds from sorted, disjoint bookings (a channel's), as they are: no merging.
    void from_lists(const std::vector<double>& starts, const std::vector<double>& ends) {
        node_.clear();
        free_.clear();
        root_ = last_ = -1;
        size_ = 0;
        for (std::size_t k = 0; k < starts.size(); ++k) {
            int n = make(starts[k], ends[k]);
            root_ = join(root_, n);
            last_ = n;
        }
        refresh_all();
    }

 private:
    struct Node {
        double start, end;
        double gap;      // next start - end (inf for the last booking)
        double next;     // the next booking's start (inf for the last)
        double max_gap;  // widest gap in the subtree
        double max_end;  // the subtree's last end (its rightmost node's end)
        std::uint32_t prio;
        int left, right;
    };

    static constexpr double kInf = std::numeric_limits<double>::infinity();

    std::vector<Node> node_;
    std::vector<int> free_;
    int root_ = -1;
    int last_ = -1;  // the last booking, when not empty
    int size_ = 0;
    double last_end_ = 0.0;
    std::vector<int> spine_;  // scratch of `append`
    std::uint64_t rng_ = 0x9E3779B97F4A7C15ULL;  // deterministic priorities

    // close_in for s after the last booking's start: merged into it, or a new last booking put
    // on the right spine by its priority; no split, no join.
    void append(double s, double e, double gap) {
        Node& last = node_[last_];
        spine_.clear();
        for (int cur = root_; cur >= 0; cur = node_[cur].right) spine_.push_back(cur);
        if (last.end + gap > s) {  // merged into the last booking: only ends change
            last.end = std::max(e, last.end);
        } else {
            int n = make(s, e);
            Node& prev = node_[last_];  // `make` may have moved the nodes
            prev.next = s;
            prev.gap = s - prev.end;
            // The new node goes below the last spine node of higher priority, taking the rest of
            // the spine as its left subtree.
            std::size_t k = 0;
            while (k < spine_.size() && node_[spine_[k]].prio > node_[n].prio) ++k;
            node_[n].left = k < spine_.size() ? spine_[k] : -1;
            if (k == 0) {
                root_ = n;
            } else {
                node_[spine_[k - 1]].right = n;
            }
            // Below n, the old spine's tail holds the old last booking, whose gap changed.
            for (std::size_t j = spine_.size(); j > k; --j) pull(spine_[j - 1]);
            pull(n);
            spine_.resize(k);
            last_ = n;
        }
        for (auto it = spine_.rbegin(); it != spine_.rend(); ++it) pull(*it);
        last_end_ = node_[root_].max_end;
    }

    std::uint32_t next_prio() {
        rng_ ^= rng_ << 13;
        rng_ ^= rng_ >> 7;
        rng_ ^= rng_ << 17;
        return static_cast<std::uint32_t>(rng_ >> 32);
    }

    int make(double s, double e) {
        int n;
        if (!free_.empty()) {
            n = free_.back();
            free_.pop_back();
        } else {
            n = static_cast<int>(node_.size());
            node_.push_back(Node{});
        }
        node_[n] = Node{s, e, kInf, kInf, kInf, e, next_prio(), -1, -1};
        ++size_;
        return n;
    }

    void release_one(int n) {
        free_.push_back(n);
        --size_;
    }

    void release(int t) {  // a whole subtree
        if (t < 0) return;
        if (node_[t].left >= 0) release(node_[t].left);
        if (node_[t].right >= 0) release(node_[t].right);
        release_one(t);
    }

    void pull(int n) {
        Node& x = node_[n];
        double g = x.gap, me = x.end;
        if (x.left >= 0) g = std::max(g, node_[x.left].max_gap);
        if (x.right >= 0) {
            g = std::max(g, node_[x.right].max_gap);
            me = node_[x.right].max_end;
        }
        x.max_gap = g;
        x.max_end = me;
    }

    int join(int a, int b) {  // every start in a before every start in b
        if (a < 0) return b;
        if (b < 0) return a;
        if (node_[a].prio > node_[b].prio) {
            node_[a].right = join(node_[a].right, b);
            pull(a);
            return a;
        }
        node_[b].left = join(a, node_[b].left);
        pull(b);
        return b;
    }

    // Splits t into starts < s and starts >= s.
    void split_before(int t, double s, int& lo, int& hi) {
        if (t < 0) {
            lo = hi = -1;
            return;
        }
        if (node_[t].start < s) {
            split_before(node_[t].right, s, node_[t].right, hi);
            pull(t);
            lo = t;
        } else {
            split_before(node_[t].left, s, lo, node_[t].left);
            pull(t);
            hi = t;
        }
    }

    // Removes the leftmost node of t; rest is what remains.
    void split_after_first(int t, int& rest) {
        if (node_[t].left < 0) {
            rest = node_[t].right;
            return;
        }
        split_after_first(node_[t].left, node_[t].left);
        pull(t);
        rest = t;
    }

    int leftmost(int t) const {
        while (node_[t].left >= 0) t = node_[t].left;
        return t;
    }

    int rightmost(int t) const {
        while (node_[t].right >= 0) t = node_[t].right;
        return t;
    }

    // Sets the gap of n and of its predecessor, and the aggregates on their paths.
    void fix_gaps_around(int n) {
        const double s = node_[n].start;
        // Walk from the root to n, noting its predecessor and successor on the way.
        int cur = root_, pred = -1, succ = -1;
        while (cur != n) {
            if (node_[n].start < node_[cur].start) {
                succ = cur;
                cur = node_[cur].left;
            } else {
                pred = cur;
                cur = node_[cur].right;
            }
        }
        if (node_[n].right >= 0) succ = leftmost(node_[n].right);
        if (node_[n].left >= 0) pred = rightmost(node_[n].left);
        node_[n].next = succ >= 0 ? node_[succ].start : kInf;
        node_[n].gap = succ >= 0 ? node_[succ].start - node_[n].end : kInf;
        if (pred >= 0) {
            node_[pred].next = s;
            node_[pred].gap = s - node_[pred].end;
            refresh_path_to(pred);
        }
        refresh_path_to(n);
        last_end_ = node_[root_].max_end;
    }

    // Recomputes the aggregates from `target` up to the root (by a walk down, then back up).
    void refresh_path_to(int target) { refresh_from(root_, target); }

    void refresh_from(int cur, int target) {  // recursion as deep as the treap: O(log n) expected
        if (cur != target) {
            refresh_from(node_[target].start < node_[cur].start ? node_[cur].left : node_[cur].right, target);
        }
        pull(cur);
    }

    // The nodes in the order of their starts.
    void in_order(std::vector<int>& order) const {
        order.clear();
        std::vector<int> stack;
        int cur = root_;
        while (cur >= 0 || !stack.empty()) {
            while (cur >= 0) {
                stack.push_back(cur);
                cur = node_[cur].left;
            }
            cur = stack.back();
            stack.pop_back();
            order.push_back(cur);
            cur = node_[cur].right;
        }
    }

    void refresh_all() {  // gaps from the order, then aggregates bottom-up (post-order)
        std::vector<int> order;
        in_order(order);
        for (std::size_t k = 0; k < order.size(); ++k) {
            Node& x = node_[order[k]];
            x.next = k + 1 < order.size() ? node_[order[k + 1]].start : kInf;
            x.gap = k + 1 < order.size() ? x.next - x.end : kInf;
        }
        post_order_pull(root_);
        last_end_ = root_ >= 0 ? node_[root_].max_end : 0.0;
    }

    void post_order_pull(int t) {
        if (t < 0) return;
        post_order_pull(node_[t].left);
        post_order_pull(node_[t].right);
        pull(t);
    }

    // The first booking (in order) whose end is after t; one exists (last_end_ > t). Ends are
    // sorted as starts are, the bookings being disjoint.
    int first_ending_after(double t) const {
        int cur = root_, found = -1;
        while (cur >= 0) {
            if (node_[cur].end > t) {
                found = cur;
                cur = node_[cur].left;
            } else {
                cur = node_[cur].right;
            }
        }
        return found;
    }

    // Whether a gap of width g (computed by subtraction) can hide a gap that the scan's
    // comparison accepts for width w: the subtraction's rounding is at most an ulp or two of the
    // times involved.
    bool may_fit(double g, double w, double scale) const {
        return g >= w - 4.0 * std::numeric_limits<double>::epsilon() * scale;
    }

    bool fits_after(int j, double w) const {  // the scan's own test at booking j
        const Node& x = node_[j];
        return x.next == kInf || !(x.next < x.end + w);  // the last: nothing after it
    }

    // The first booking at or after i (in order) after which a w-long copy fits.
    int first_fitting_from(int i, double w) const {
        const double scale = std::fabs(last_end_) + std::fabs(w) + 1.0;
        const double from = node_[i].start;
        int found = -1;
        search(root_, from, w, scale, found);
        return found;
    }

    // In-order search of t's nodes with start >= from for the first that fits; prunes subtrees
    // whose widest gap cannot. Returns true once found.
    bool search(int t, double from, double w, double scale, int& found) const {
        if (t < 0) return false;
        const Node& x = node_[t];
        if (!may_fit(x.max_gap, w, scale)) return false;
        if (x.start >= from) {
            if (search(x.left, from, w, scale, found)) return true;
            if (may_fit(x.gap, w, scale) && fits_after(t, w)) {
                found = t;
                return true;
            }
        }
        return search(x.right, from, w, scale, found);
    }
};

}  // namespace baechi
