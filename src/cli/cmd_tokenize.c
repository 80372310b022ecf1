/*
 * cmd_tokenize - `weld tokenize`: print the token ids of a text.
 *
 * The tokenizer comes from a model (-m: a GGUF file's tokenizer.* metadata, or a Hugging
 * Face directory's tokenizer.json + tokenizer_config.json) or straight from a tokenizer.json
 * (--tokenizer). Output: the ids on one line, space-separated; with --show-pieces one
 * "id<TAB>piece" line per token: the text the token adds after the one before it (decode of
 * both minus decode of the previous one, so SentencePiece leading spaces show), with control
 * characters escaped (\n, \t, \r, \xNN) so every token stays on its line.
 */
#include "cli/cli.h"

#include "core/alloc.h"
#include "core/err.h"
#include "format/gguf.h"
#include "model/resolve.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static int load(const char *model, const char *tok_path, struct tokenizer **t,
                struct weld_err *e)
{
    if (tok_path)
        return tokenizer_load_hf(t, tok_path, e);
    struct stat st;
    char where[4096];
    int rc = model_resolve_path(model, where, sizeof where, e);
    if (rc)
        return rc;
    model = where;
    if (stat(model, &st) != 0)
        return err_set(e, WELD_ERR_IO, "%s: no such file or directory", model);
    if (S_ISDIR(st.st_mode))
        return tokenizer_load_hf(t, model, e);
    struct gguf_file *f = NULL;
    rc = gguf_open(&f, model, e);
    if (rc == WELD_OK)
        rc = tokenizer_load_gguf(t, f, e);
    gguf_close(f);
    return rc;
}

static void print_piece(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", stdout);
        else if (c == '\t')
            fputs("\\t", stdout);
        else if (c == '\r')
            fputs("\\r", stdout);
        else if (c < 0x20 || c == 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
}

static int print_ids(const struct tokenizer *t, const int32_t *ids, size_t n, bool pieces,
                     struct weld_err *e)
{
    for (size_t i = 0; i < n; i++) {
        if (!pieces) {
            printf(i ? " %d" : "%d", ids[i]);
            continue;
        }
        char *s = NULL, *p = NULL;
        size_t len = 0, plen = 0, skip = 0;
        int rc = tokenizer_decode(t, &ids[i ? i - 1 : 0], i ? 2 : 1, false, &s, &len, e);
        if (rc == WELD_OK && i)
            rc = tokenizer_decode(t, &ids[i - 1], 1, false, &p, &plen, e);
        if (rc == WELD_OK && i && plen <= len && memcmp(s, p, plen) == 0)
            skip = plen;
        if (rc == WELD_OK) {
            printf("%d\t", ids[i]);
            print_piece(s + skip, len - skip);
            putchar('\n');
        }
        wfree(s);
        wfree(p);
        if (rc)
            return rc;
    }
    if (!pieces)
        putchar('\n');
    return WELD_OK;
}

int cmd_tokenize(int argc, char **argv)
{
    const char *model = NULL, *tok_path = NULL;
    bool no_special = false, no_parse = false, pieces = false;
    const struct cli_opt opts[] = {
        {"model", 'm', OPT_STR, &model, "MODEL", "GGUF file or Hugging Face directory"},
        {"tokenizer", 0, OPT_STR, &tok_path, "PATH", "a tokenizer.json (or its directory) instead of -m"},
        {"no-special", 0, OPT_FLAG, &no_special, NULL, "do not add BOS/EOS (the post-processor's tokens)"},
        {"no-parse-special", 0, OPT_FLAG, &no_parse, NULL, "treat special tokens spelled in TEXT as plain text"},
        {"show-pieces", 0, OPT_FLAG, &pieces, NULL, "print one \"id<TAB>piece\" line per token"},
    };
    const char *pos[1];
    int n_pos = 0;
    int prc = cli_parse(argc, argv, "tokenize (-m MODEL | --tokenizer tokenizer.json) [options] TEXT",
                        "Print the token ids of TEXT, space-separated on one line.", opts,
                        (int)(sizeof opts / sizeof opts[0]), pos, 1, &n_pos);
    if (prc)
        return prc == 1 ? 0 : 2;
    if ((!model && !tok_path) || (model && tok_path) || n_pos != 1) {
        fprintf(stderr, "weld tokenize: give exactly one of -m MODEL or --tokenizer PATH, and "
                        "TEXT (see --help)\n");
        return 2;
    }
    struct weld_err e;
    err_clear(&e);
    struct tokenizer *t = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = load(model, tok_path, &t, &e);
    if (rc == WELD_OK)
        rc = tokenizer_encode(t, pos[0], strlen(pos[0]), !no_special, !no_parse, &ids, &n, &e);
    if (rc == WELD_OK)
        rc = print_ids(t, ids, n, pieces, &e);
    if (rc)
        fprintf(stderr, "weld tokenize: %s\n", e.msg);
    wfree(ids);
    tokenizer_free(t);
    return rc ? 1 : 0;
}
