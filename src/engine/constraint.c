/*
 * constraint - see constraint.h. The cache is a list in use order (most recent first);
 * it holds at most CONSTRAINT_CACHE entries nobody references, plus those in use.
 */
#include "engine/constraint.h"

#include "core/alloc.h"
#include "grammar/grammar.h"
#include "grammar/vocab.h"
#include "tokenizer/tokenizer.h"

#include <string.h>
#include <xxhash.h>

struct constraint {
    struct constraint *next;
    char *text;
    size_t len;
    uint64_t hash;
    struct grammar *g;
    struct gspace *sp; /* its matchers' nodes, states and cached masks */
    int refs;
};

struct constraints {
    const struct tokenizer *tok;
    int n_vocab;
    struct gvocab *v;
    struct constraint *head;
    uint64_t hits, compiles;
};

int constraints_create(struct constraints **out, const struct tokenizer *tok, int n_vocab,
                       struct weld_err *e)
{
    struct constraints *c = wcalloc(1, sizeof *c);
    if (!c)
        return err_set(e, WELD_ERR_NOMEM, "engine: out of memory");
    c->tok = tok;
    c->n_vocab = n_vocab;
    *out = c;
    return WELD_OK;
}

static void entry_free(struct constraint *k)
{
    gspace_free(k->sp);
    grammar_free(k->g);
    wfree(k->text);
    wfree(k);
}

void constraints_free(struct constraints *c)
{
    if (!c)
        return;
    for (struct constraint *k = c->head, *n; k; k = n) {
        n = k->next;
        entry_free(k);
    }
    gvocab_free(c->v);
    wfree(c);
}

/* Drop unreferenced entries past the first CONSTRAINT_CACHE unreferenced ones, and the
   cached states of unreferenced entries past CONSTRAINT_IDLE_BYTES of them (most recently
   used first). */
static void trim(struct constraints *c)
{
    int idle = 0;
    size_t bytes = 0;
    for (struct constraint **pp = &c->head; *pp;) {
        struct constraint *k = *pp;
        if (k->refs == 0 && ++idle > CONSTRAINT_CACHE) {
            *pp = k->next;
            entry_free(k);
            continue;
        }
        if (k->refs == 0) {
            struct gspace_counts gc;
            gspace_counts(k->sp, &gc);
            if (bytes + gc.bytes > CONSTRAINT_IDLE_BYTES)
                gspace_drop(k->sp);
            else
                bytes += gc.bytes;
        }
        pp = &k->next;
    }
}

int constraint_get(struct constraints *c, const char *text, struct constraint **out,
                   const struct gvocab **v, struct weld_err *e)
{
    *out = NULL;
    if (!c->tok)
        return err_set(e, WELD_ERR_INVALID_ARG, "grammar: a constraint needs the model's "
                       "tokenizer, and this model has none");
    int rc;
    if (!c->v && (rc = gvocab_create(&c->v, c->tok, c->n_vocab, e)))
        return rc;
    if (c->v->n_vocab != c->n_vocab)
        return err_set(e, WELD_ERR_INVALID_ARG, "grammar: the tokenizer has %d tokens, more "
                       "than the model's %d", c->v->n_vocab, c->n_vocab);
    *v = c->v;
    const size_t len = strlen(text);
    const uint64_t h = XXH3_64bits(text, len);
    for (struct constraint **pp = &c->head; *pp; pp = &(*pp)->next) {
        struct constraint *k = *pp;
        if (k->hash == h && k->len == len && !memcmp(k->text, text, len)) {
            *pp = k->next; /* to the front */
            k->next = c->head;
            c->head = k;
            k->refs++;
            c->hits++;
            *out = k;
            return WELD_OK;
        }
    }
    struct constraint *k = wcalloc(1, sizeof *k);
    if (!k || !(k->text = wmalloc(len + 1))) {
        wfree(k);
        return err_set(e, WELD_ERR_NOMEM, "grammar: out of memory");
    }
    memcpy(k->text, text, len + 1);
    k->len = len, k->hash = h;
    if ((rc = grammar_parse_gbnf(&k->g, text, len, NULL, e)) ||
        (rc = gspace_create(&k->sp, k->g, e))) {
        entry_free(k);
        return rc;
    }
    c->compiles++;
    k->refs = 1;
    k->next = c->head;
    c->head = k;
    trim(c);
    *out = k;
    return WELD_OK;
}

void constraint_release(struct constraints *c, struct constraint *k)
{
    if (!k)
        return;
    k->refs--;
    trim(c);
}

struct gspace *constraint_space(const struct constraint *k)
{
    return k->sp;
}

void constraints_counts(const struct constraints *c, uint64_t *hits, uint64_t *compiles)
{
    *hits = c->hits;
    *compiles = c->compiles;
}
