// The lexical table of the router's BM25: each token's postings (tool, term score), registered by the caller as
// requests first use the token, summed per request text in native code. Readers and a writer may run at once (the
// serving engine routes from several threads): adds take the lock exclusively, sums share it.
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "common.hpp"
#include "kernels.hpp"

struct nexus_lex {
    struct Posting {
        std::vector<int64_t> docs;
        std::vector<double> terms;
    };
    int64_t n_docs = 0;
    std::vector<Posting> tokens;
    mutable std::shared_mutex mu;
};

namespace nexus {

void lex_scores(const nexus_lex *lex, const int32_t *tokens, int64_t n_tokens, double *out) {
    std::shared_lock<std::shared_mutex> lock(lex->mu);
    const int64_t n_known = static_cast<int64_t>(lex->tokens.size());
    for (int64_t t = 0; t < n_tokens; ++t)
        if (tokens[t] < 0 || tokens[t] >= n_known) invalid("token " + std::to_string(tokens[t]) + " is not registered");
    for (int64_t i = 0; i < lex->n_docs; ++i) out[i] = 0.0;
    // in the order given: the caller's order of additions, so the same bits as its own sum
    for (int64_t t = 0; t < n_tokens; ++t) {
        const auto &p = lex->tokens[static_cast<size_t>(tokens[t])];
        for (size_t j = 0; j < p.docs.size(); ++j) out[p.docs[j]] += p.terms[j];
    }
}

int64_t lex_docs(const nexus_lex *lex) { return lex->n_docs; }

}  // namespace nexus

extern "C" {

int32_t nexus_lex_create(int64_t n_docs, nexus_lex **out) {
    return nexus::guard([&] {
        nexus::require_ptr(out, "out");
        *out = nullptr;
        if (n_docs < 1) nexus::invalid("n_docs must be >= 1, got " + std::to_string(n_docs));
        auto *lex = new nexus_lex();
        lex->n_docs = n_docs;
        *out = lex;
    });
}

void nexus_lex_free(nexus_lex *lex) { delete lex; }

int32_t nexus_lex_add(nexus_lex *lex, const int64_t *docs, const double *terms, int64_t count, int32_t *token_out) {
    return nexus::guard([&] {
        nexus::require_ptr(lex, "lex");
        nexus::require_ptr(token_out, "token_out");
        if (count < 0) nexus::invalid("count must be >= 0, got " + std::to_string(count));
        if (count > 0) {
            nexus::require_ptr(docs, "docs");
            nexus::require_ptr(terms, "terms");
        }
        for (int64_t j = 0; j < count; ++j)
            if (docs[j] < 0 || docs[j] >= lex->n_docs)
                nexus::invalid("doc " + std::to_string(docs[j]) + " is outside 0.." + std::to_string(lex->n_docs - 1));
        nexus_lex::Posting p;
        p.docs.assign(docs, docs + count);
        p.terms.assign(terms, terms + count);
        std::unique_lock<std::shared_mutex> lock(lex->mu);
        if (lex->tokens.size() >= static_cast<size_t>(INT32_MAX)) nexus::invalid("the lexical table is full");
        lex->tokens.push_back(std::move(p));
        *token_out = static_cast<int32_t>(lex->tokens.size() - 1);
    });
}

int32_t nexus_lex_scores(const nexus_lex *lex, const int32_t *tokens, int64_t n_tokens, double *out) {
    return nexus::guard([&] {
        nexus::require_ptr(lex, "lex");
        nexus::require_ptr(out, "out");
        if (n_tokens < 0) nexus::invalid("n_tokens must be >= 0, got " + std::to_string(n_tokens));
        if (n_tokens > 0) nexus::require_ptr(tokens, "tokens");
        nexus::lex_scores(lex, tokens, n_tokens, out);
    });
}

}  // extern "C"
