// The router's ranking of one request's per-tool scores: the k best tools and the gate's margin, in one pass.
#include <cmath>
#include <string>

#include "common.hpp"

namespace {

// NaN ranks below every number (as a descending NumPy sort puts it last); ties go to the lower index.
inline bool ahead(double a, int64_t ia, double b, int64_t ib) {
    const bool na = std::isnan(a), nb = std::isnan(b);
    if (na || nb) return !na && nb ? true : (na && nb ? ia < ib : false);
    return a > b || (a == b && ia < ib);
}

}  // namespace

extern "C" {

int32_t nexus_rank_tools(const double *scores, int64_t n, int32_t k, const int32_t *group_of, int64_t *order_out,
                         int32_t *n_out, double *margin_out) {
    return nexus::guard([&] {
        if (n < 1) nexus::invalid("n must be >= 1, got " + std::to_string(n));
        if (k < 1) nexus::invalid("k must be >= 1, got " + std::to_string(k));
        nexus::require_ptr(scores, "scores");
        nexus::require_ptr(order_out, "order_out");
        nexus::require_ptr(n_out, "n_out");
        nexus::require_ptr(margin_out, "margin_out");
        const int32_t want = static_cast<int32_t>(n < k ? n : k);
        // insertion into the sorted head: rows arrive in index order, so an equal score stays behind
        int32_t cnt = 0;
        double last = NAN;  // the score of the last one kept, once the head is full
        for (int64_t i = 0; i < n; ++i) {
            // most scores fall below the k-th kept one: an ordered compare (false with a NaN) settles them at once
            if (cnt == want && (scores[i] < last || !ahead(scores[i], i, last, order_out[want - 1]))) continue;
            int32_t pos = cnt < want ? cnt++ : want - 1;
            while (pos > 0 && ahead(scores[i], i, scores[order_out[pos - 1]], order_out[pos - 1])) {
                order_out[pos] = order_out[pos - 1];
                --pos;
            }
            order_out[pos] = i;
            if (cnt == want) last = scores[order_out[want - 1]];
        }
        *n_out = want;
        // the margin: the top tool's score minus the best score of a tool that is neither it nor in its group of
        // interchangeable copies (group_of[i] >= 0; NULL: no groups); inf when there is none, or when that best is
        // not a finite number (a NaN among them propagates, as NumPy's max does)
        const int64_t top = order_out[0];
        const int32_t g = group_of ? group_of[top] : -1;
        double best = -INFINITY;
        bool any = false, nan = false;
        for (int64_t i = 0; i < n; ++i) {  // without branches on the scores: selects, not jumps
            const bool other = i != top && !(g >= 0 && group_of[i] == g);
            const double s = scores[i];
            any |= other;
            nan |= other && s != s;
            best = other && s > best ? s : best;
        }
        *margin_out = !any || nan || !std::isfinite(best) ? INFINITY : scores[top] - best;
    });
}

int32_t nexus_rank_tools_packed(const nexus_rank_args *a) {
    if (!a) return nexus::guard([] { nexus::require_ptr(nullptr, "args"); });
    return nexus_rank_tools(a->scores, a->n, a->k, a->group_of, a->order_out, a->n_out, a->margin_out);
}

}  // extern "C"
