// Token trie: one node per distinct prefix, children kept as a vector sorted by token id (binary search on lookup;
// tool-name sequences are short and fan out little, so this beats hash maps on memory and on the sorted output
// that nexus_trie_next has to return anyway). Not synchronized: concurrent reads are fine, writes need the caller's lock.
#include <algorithm>
#include <string>
#include <vector>

#include "common.hpp"

struct nexus_trie {
    struct Edge {
        int32_t token;
        uint32_t child;
    };
    struct Node {
        std::vector<Edge> edges;  // sorted by token
        int32_t value = -1;
    };
    std::vector<Node> nodes{1};  // nodes[0] is the root (the empty prefix)
    int64_t n_sequences = 0;

    // Child of `node` through `token`, or -1.
    int64_t find(uint32_t node, int32_t token) const {
        const auto &e = nodes[node].edges;
        auto it = std::lower_bound(e.begin(), e.end(), token, [](const Edge &a, int32_t t) { return a.token < t; });
        return (it != e.end() && it->token == token) ? static_cast<int64_t>(it->child) : -1;
    }
};

using namespace nexus;

extern "C" {

int32_t nexus_trie_create(nexus_trie **out) {
    return guard([&] {
        require_ptr(out, "out");
        *out = new nexus_trie();
    });
}

void nexus_trie_free(nexus_trie *trie) { delete trie; }

int32_t nexus_trie_insert(nexus_trie *trie, const int32_t *tokens, int64_t n, int32_t value) {
    return guard([&] {
        require_ptr(trie, "trie");
        if (n < 1) invalid("a sequence must have at least one token, got n = " + std::to_string(n));
        require_ptr(tokens, "tokens");
        if (value < 0) invalid("value must be >= 0 (-1 means 'no sequence ends here'), got " + std::to_string(value));
        if (static_cast<uint64_t>(trie->nodes.size()) + static_cast<uint64_t>(n) > UINT32_MAX)
            fail(NEXUS_ERR_NOMEM, "trie node index space exhausted");
        uint32_t node = 0;
        for (int64_t i = 0; i < n; ++i) {
            auto &edges = trie->nodes[node].edges;
            const int32_t tok = tokens[i];
            auto it = std::lower_bound(edges.begin(), edges.end(), tok,
                                       [](const nexus_trie::Edge &a, int32_t t) { return a.token < t; });
            if (it != edges.end() && it->token == tok) {
                node = it->child;
                continue;
            }
            const auto child = static_cast<uint32_t>(trie->nodes.size());
            edges.insert(it, nexus_trie::Edge{tok, child});  // before emplace_back: it may reallocate `nodes`
            trie->nodes.emplace_back();
            node = child;
        }
        if (trie->nodes[node].value < 0) ++trie->n_sequences;
        trie->nodes[node].value = value;
    });
}

int32_t nexus_trie_next(const nexus_trie *trie, const int32_t *prefix, int64_t n, int32_t *next_out, int64_t cap,
                        int64_t *n_next, int32_t *terminal_value) {
    return guard([&] {
        require_ptr(trie, "trie");
        require_ptr(n_next, "n_next");
        require_ptr(terminal_value, "terminal_value");
        if (n < 0) invalid("prefix length must be >= 0, got " + std::to_string(n));
        if (n > 0) require_ptr(prefix, "prefix");
        if (cap < 0) invalid("cap must be >= 0, got " + std::to_string(cap));
        if (cap > 0) require_ptr(next_out, "next_out");
        int64_t node = 0;
        for (int64_t i = 0; i < n && node >= 0; ++i) node = trie->find(static_cast<uint32_t>(node), prefix[i]);
        if (node < 0) {
            *n_next = 0;
            *terminal_value = -1;
            return;
        }
        const auto &nd = trie->nodes[static_cast<size_t>(node)];
        const int64_t total = static_cast<int64_t>(nd.edges.size());
        const int64_t w = std::min(total, cap);
        for (int64_t i = 0; i < w; ++i) next_out[i] = nd.edges[static_cast<size_t>(i)].token;
        *n_next = total;
        *terminal_value = nd.value;
    });
}

int32_t nexus_trie_size(const nexus_trie *trie, int64_t *n_sequences, int64_t *n_nodes) {
    return guard([&] {
        require_ptr(trie, "trie");
        if (n_sequences) *n_sequences = trie->n_sequences;
        if (n_nodes) *n_nodes = static_cast<int64_t>(trie->nodes.size());
    });
}

}  // extern "C"
