// Token trie: next-token sets, terminal values, replacement, sizes, unknown prefixes, errors.
#include <map>
#include <set>
#include <vector>

#include "check.hpp"

int main() {
    nexus_trie *t = nullptr;
    CHECK_OK(nexus_trie_create(&t));
    const std::vector<std::vector<int32_t>> seqs = {{5, 9, 2}, {5, 9}, {5, 1}, {7}, {-3, 100000, 2}};
    for (size_t i = 0; i < seqs.size(); ++i)
        CHECK_OK(nexus_trie_insert(t, seqs[i].data(), static_cast<int64_t>(seqs[i].size()), static_cast<int32_t>(i)));
    int64_t n_seq = 0, n_nodes = 0;
    CHECK_OK(nexus_trie_size(t, &n_seq, &n_nodes));
    CHECK(n_seq == 5);
    CHECK(n_nodes == 1 + 3 + 1 + 1 + 3);  // root, 5-9-2, 5-1, 7, -3-100000-2

    int32_t next[8];
    int64_t n_next = -1;
    int32_t term = 99;
    CHECK_OK(nexus_trie_next(t, nullptr, 0, next, 8, &n_next, &term));
    CHECK(n_next == 3 && next[0] == -3 && next[1] == 5 && next[2] == 7 && term == -1);
    const int32_t p5[] = {5};
    CHECK_OK(nexus_trie_next(t, p5, 1, next, 8, &n_next, &term));
    CHECK(n_next == 2 && next[0] == 1 && next[1] == 9 && term == -1);
    const int32_t p59[] = {5, 9};
    CHECK_OK(nexus_trie_next(t, p59, 2, next, 8, &n_next, &term));
    CHECK(n_next == 1 && next[0] == 2 && term == 1);
    const int32_t p592[] = {5, 9, 2};
    CHECK_OK(nexus_trie_next(t, p592, 3, next, 8, &n_next, &term));
    CHECK(n_next == 0 && term == 0);
    const int32_t missing[] = {5, 8};
    CHECK_OK(nexus_trie_next(t, missing, 2, next, 8, &n_next, &term));
    CHECK(n_next == 0 && term == -1);
    // a small cap still reports the total
    CHECK_OK(nexus_trie_next(t, nullptr, 0, next, 1, &n_next, &term));
    CHECK(n_next == 3 && next[0] == -3);
    CHECK_OK(nexus_trie_next(t, nullptr, 0, nullptr, 0, &n_next, &term));
    CHECK(n_next == 3);
    // re-inserting replaces the value, the counts stay
    CHECK_OK(nexus_trie_insert(t, p59, 2, 42));
    CHECK_OK(nexus_trie_next(t, p59, 2, next, 8, &n_next, &term));
    CHECK(term == 42);
    CHECK_OK(nexus_trie_size(t, &n_seq, &n_nodes));
    CHECK(n_seq == 5 && n_nodes == 9);

    // many random sequences against a std::map model
    Rng rng(99);
    std::map<std::vector<int32_t>, int32_t> model;
    nexus_trie *r = nullptr;
    CHECK_OK(nexus_trie_create(&r));
    for (int i = 0; i < 3000; ++i) {
        std::vector<int32_t> s(1 + rng.next() % 6);
        for (auto &x : s) x = static_cast<int32_t>(rng.next() % 8);
        model[s] = i;
        CHECK_OK(nexus_trie_insert(r, s.data(), static_cast<int64_t>(s.size()), i));
    }
    for (const auto &[s, val] : model) {
        for (size_t plen = 0; plen <= s.size(); ++plen) {
            std::vector<int32_t> prefix(s.begin(), s.begin() + plen);
            std::set<int32_t> want;
            int32_t want_term = -1;
            for (const auto &[s2, v2] : model) {
                if (s2.size() < plen || !std::equal(prefix.begin(), prefix.end(), s2.begin())) continue;
                if (s2.size() == plen) want_term = v2;
                else want.insert(s2[plen]);
            }
            int32_t out[16];
            CHECK_OK(nexus_trie_next(r, prefix.data(), static_cast<int64_t>(plen), out, 16, &n_next, &term));
            CHECK(term == want_term);
            CHECK(std::vector<int32_t>(out, out + n_next) == std::vector<int32_t>(want.begin(), want.end()));
        }
        if (s.size() > 3) break;  // the exhaustive model scan is quadratic: a few hundred prefixes are plenty
    }
    CHECK_OK(nexus_trie_size(r, &n_seq, nullptr));
    CHECK(n_seq == static_cast<int64_t>(model.size()));

    CHECK_ERR(nexus_trie_insert(t, nullptr, 0, 1), NEXUS_ERR_INVALID, "at least one token");
    CHECK_ERR(nexus_trie_insert(t, p5, 1, -1), NEXUS_ERR_INVALID, "value must be >= 0");
    CHECK_ERR(nexus_trie_next(t, p5, -1, next, 8, &n_next, &term), NEXUS_ERR_INVALID, "prefix length");
    CHECK_ERR(nexus_trie_next(t, p5, 1, nullptr, 8, &n_next, &term), NEXUS_ERR_INVALID, "next_out is NULL");
    CHECK_ERR(nexus_trie_size(nullptr, &n_seq, &n_nodes), NEXUS_ERR_INVALID, "trie is NULL");
    CHECK_ERR(nexus_trie_create(nullptr), NEXUS_ERR_INVALID, "out is NULL");
    nexus_trie_free(t);
    nexus_trie_free(r);
    nexus_trie_free(nullptr);
    return finish("test_trie");
}
