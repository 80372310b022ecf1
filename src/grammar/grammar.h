/*
 * grammar - context-free grammars over bytes, the core of constrained decoding.
 *
 * A grammar is written in GBNF, llama.cpp's notation (rules `name ::= alternatives`,
 * "literals", [classes] and [^negated] ones over code points, `.`, ( groups ), `*` `+` `?`
 * `{m}` `{m,}` `{m,n}`, `#` comments; escapes \n \r \t \\ \" \[ \] \- \xHH \uHHHH
 * \UHHHHHHHH). It compiles to rules whose terminals are byte ranges: a code-point class
 * becomes the alternatives of its UTF-8 byte sequences, so a token that ends inside a
 * multi-byte character is matched like any other byte string. Groups, repetitions and
 * classes become auxiliary rules (`name_N`); repetition is right-recursive.
 *
 * Compilation refuses, with line and column: syntax errors, undefined rules, repetition
 * counts above GRAMMAR_MAX_REPEAT, left recursion (a rule reaching itself before consuming
 * a byte, which a stack matcher cannot run), and grammars no string satisfies.
 *
 * A matcher (struct gmatch) holds a set of stacks, a nondeterministic pushdown automaton:
 * each stack is a chain of continuation nodes whose top is the byte range to match next.
 * Nodes are interned by (element, parent), so equal stacks are one node and a repetition
 * reuses the nodes of its previous round. gmatch_accept consumes bytes (all or nothing);
 * gmatch_can_end says whether the input so far is a complete sentence. The nodes live in
 * a space (struct gspace) that matchers of one grammar may share (one thread at a time),
 * with the states met so far, their transitions and their token masks (match.c).
 */
#ifndef WELD_GRAMMAR_GRAMMAR_H
#define WELD_GRAMMAR_GRAMMAR_H

#include "core/err.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GRAMMAR_MAX_REPEAT 1000

enum gr_kind { GR_END = 0, GR_BYTES, GR_RULE };

/* One element of an alternative: a byte range [lo, hi], a rule reference, or the end. */
struct gr_elem {
    uint8_t kind, lo, hi;
    int32_t rule;
};

struct grammar {
    struct gr_elem *el;  /* every alternative's elements, each ending with GR_END */
    int32_t *alt;        /* (n_alt) index in el of each alternative's first element */
    int32_t *rule_alt0;  /* (n_rules) its first alternative; a rule's are contiguous */
    int32_t *rule_n_alt; /* (n_rules) */
    char **names;        /* (n_rules) */
    int n_el, n_alt, n_rules;
    int root;
};

/* Compile GBNF text; root names the start rule (NULL: "root"). */
int grammar_parse_gbnf(struct grammar **out, const char *text, size_t len, const char *root,
                       struct weld_err *e);
void grammar_free(struct grammar *g);

struct gmatch;
struct gspace;

/* The budget of a space's states, transitions and masks (dropped together when spent). */
#define GSPACE_BUDGET ((size_t)64 << 20)

int gspace_create(struct gspace **out, const struct grammar *g, struct weld_err *e);
void gspace_free(struct gspace *s);
void gspace_set_budget(struct gspace *s, size_t bytes);
/* Forget the states, transitions and masks (not the nodes): memory back, cache cold. */
void gspace_drop(struct gspace *s);
struct gspace_counts {
    uint64_t mask_hits, mask_misses; /* masks copied from a state's cache / walked */
    int states;
    size_t bytes;
};
void gspace_counts(const struct gspace *s, struct gspace_counts *c);

/* A matcher in space s (which must outlive it), or in a space of its own. */
int gmatch_create_in(struct gmatch **out, struct gspace *s, struct weld_err *e);
int gmatch_create(struct gmatch **out, const struct grammar *g, struct weld_err *e);
void gmatch_free(struct gmatch *m);
/* Consume n bytes: true if the grammar allows them here (the state advances), else false
   and the state is unchanged. */
bool gmatch_accept(struct gmatch *m, const uint8_t *s, size_t n);
/* The bytes consumed so far form a complete sentence. */
bool gmatch_can_end(const struct gmatch *m);
/* Back to the start. */
void gmatch_reset(struct gmatch *m);
/* The bytes the grammar forces from here (each the only byte allowed, while the input may
   not end), at most max of them into out; the state does not change. */
int gmatch_forced(struct gmatch *m, uint8_t *out, int max);
/* A matcher's state kept aside (a rollback point: a rejected speculative token); valid
   for the matcher it came from. */
struct gmatch_state {
    int32_t *tops;
    int n;
    bool can_end;
};
int gmatch_save(const struct gmatch *m, struct gmatch_state *st, struct weld_err *e);
void gmatch_restore(struct gmatch *m, const struct gmatch_state *st);
void gmatch_state_free(struct gmatch_state *st);

#endif
