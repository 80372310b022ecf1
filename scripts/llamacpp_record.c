/*
 * llamacpp_record - record what llama.cpp makes of a GGUF file, as the reference data of
 * test_exec_llamacpp_oracle (tests/data/llamacpp_oracle/). Built and run only by
 * scripts/record-llamacpp-oracle.sh against a llama.cpp build outside the repository; the
 * test suite never needs llama.cpp.
 *
 *   llamacpp_record MODEL.gguf N_GEN TOP_K PROMPTS.jsonl CORPUS.jsonl|- -- MKMODEL_ARGS...
 *
 * PROMPTS.jsonl and CORPUS.jsonl hold one JSON string per line. Each prompt is tokenized
 * the way llama-tokenize does (add the vocabulary's BOS when it asks for one, special
 * tokens parsed), decoded as one batch, then N_GEN tokens are decoded greedily one at a
 * time; at each of the N_GEN positions the TOP_K largest logits are written (ties to the
 * lower id). The context runs on the CPU with f32 K/V and flash attention off, the
 * arithmetic weld's runner uses (attention in f32). Each corpus string is tokenized with
 * and without special-token parsing, as `llama-tokenize --ids [--no-parse-special]`
 * prints it. The output (stdout) is one JSON object; MKMODEL_ARGS are copied into it as
 * the `weld mkmodel` arguments that regenerate MODEL, with its size and XXH64, and
 * $LLAMACPP_COMMIT as the llama.cpp version.
 */
#include "llama.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static void quiet(enum ggml_log_level level, const char *text, void *user)
{
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

static void die(const char *msg, const char *arg)
{
    fprintf(stderr, "llamacpp_record: %s%s\n", msg, arg ? arg : "");
    exit(1);
}

/* Lines of a file of JSON strings. */
static char **read_strings(const char *path, int *n_out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        die("cannot open ", path);
    char **v = NULL;
    int n = 0;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        json_error_t je;
        json_t *s = json_loads(line, JSON_DECODE_ANY, &je);
        if (!json_is_string(s))
            die("not a JSON string in ", path);
        v = realloc(v, sizeof *v * (size_t)(n + 1));
        v[n] = malloc(json_string_length(s) + 1);
        memcpy(v[n], json_string_value(s), json_string_length(s) + 1);
        n++;
        json_decref(s);
    }
    free(line);
    fclose(f);
    *n_out = n;
    return v;
}

static int tokenize(const struct llama_vocab *vocab, const char *text, bool parse_special,
                    llama_token **out)
{
    int len = (int)strlen(text), cap = len + 8;
    bool add = llama_vocab_get_add_bos(vocab);
    llama_token *t = malloc(sizeof *t * (size_t)cap);
    int n = llama_tokenize(vocab, text, len, t, cap, add, parse_special);
    if (n < 0) {
        cap = -n;
        t = realloc(t, sizeof *t * (size_t)cap);
        n = llama_tokenize(vocab, text, len, t, cap, add, parse_special);
    }
    if (n < 0)
        die("llama_tokenize failed on ", text);
    *out = t;
    return n;
}

static void print_ids(const llama_token *t, int n)
{
    printf("[");
    for (int i = 0; i < n; i++)
        printf("%s%d", i ? ", " : "", t[i]);
    printf("]");
}

static void print_string(const char *s)
{
    json_t *j = json_string(s);
    char *d = json_dumps(j, JSON_ENCODE_ANY | JSON_ENSURE_ASCII);
    fputs(d, stdout);
    free(d);
    json_decref(j);
}

/* Indices of the k largest values, largest first, ties to the lower index. */
static void top_k(const float *v, int n, int k, int *idx)
{
    for (int j = 0; j < k; j++)
        idx[j] = -1;
    for (int i = 0; i < n; i++) {
        int j = k;
        while (j > 0 && (idx[j - 1] < 0 || v[i] > v[idx[j - 1]]))
            j--;
        if (j == k)
            continue;
        memmove(idx + j + 1, idx + j, sizeof *idx * (size_t)(k - j - 1));
        idx[j] = i;
    }
}

static void file_hash(const char *path, long *size, unsigned long long *h)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        die("cannot open ", path);
    XXH64_state_t *st = XXH64_createState();
    XXH64_reset(st, 0);
    static char buf[1 << 16];
    size_t n;
    *size = 0;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        XXH64_update(st, buf, n);
        *size += (long)n;
    }
    *h = (unsigned long long)XXH64_digest(st);
    XXH64_freeState(st);
    fclose(f);
}

int main(int argc, char **argv)
{
    if (argc < 7 || strcmp(argv[6], "--") != 0)
        die("usage: llamacpp_record MODEL N_GEN TOP_K PROMPTS.jsonl CORPUS.jsonl|- -- "
            "MKMODEL_ARGS...", NULL);
    const char *path = argv[1];
    int n_gen = atoi(argv[2]), k = atoi(argv[3]), n_prompts = 0, n_corpus = 0;
    char **prompts = read_strings(argv[4], &n_prompts);
    char **corpus = strcmp(argv[5], "-") ? read_strings(argv[5], &n_corpus) : NULL;

    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(path, mp);
    if (!model)
        die("llama.cpp could not load ", path);
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);

    long size;
    unsigned long long hash;
    file_hash(path, &size, &hash);
    printf("{\n\"mkmodel\": [");
    for (int i = 7; i < argc; i++) {
        printf("%s", i > 7 ? ", " : "");
        print_string(argv[i]);
    }
    printf("],\n\"file_size\": %ld,\n\"file_xxh64\": \"%016llx\",\n", size, hash);
    printf("\"n_vocab\": %d,\n\"llama_cpp\": \"%s\",\n\"runs\": [\n", n_vocab,
           getenv("LLAMACPP_COMMIT") ? getenv("LLAMACPP_COMMIT") : "");

    int *idx = malloc(sizeof *idx * (size_t)k);
    for (int p = 0; p < n_prompts; p++) {
        struct llama_context_params cp = llama_context_default_params();
        cp.n_ctx = 256;
        cp.n_batch = 256;
        cp.n_ubatch = 256;
        cp.type_k = GGML_TYPE_F32;
        cp.type_v = GGML_TYPE_F32;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
        cp.n_threads = 2;
        cp.n_threads_batch = 2;
        cp.no_perf = true;
        struct llama_context *ctx = llama_init_from_model(model, cp);
        if (!ctx)
            die("llama.cpp could not make a context for ", path);
        llama_token *ids;
        int n = tokenize(vocab, prompts[p], true, &ids);
        printf("%s{\"text\": ", p ? ",\n" : "");
        print_string(prompts[p]);
        printf(",\n \"prompt\": ");
        print_ids(ids, n);
        if (llama_decode(ctx, llama_batch_get_one(ids, n)))
            die("llama_decode failed on the prompt of ", path);
        llama_token *gen = malloc(sizeof *gen * (size_t)n_gen);
        printf(",\n \"top\": [");
        for (int s = 0; s < n_gen; s++) {
            const float *lg = llama_get_logits_ith(ctx, -1);
            top_k(lg, n_vocab, k, idx);
            printf("%s\n  [", s ? "," : "");
            for (int j = 0; j < k; j++)
                printf("%s[%d, %.9g]", j ? ", " : "", idx[j], (double)lg[idx[j]]);
            printf("]");
            gen[s] = idx[0];
            if (s + 1 < n_gen && llama_decode(ctx, llama_batch_get_one(&gen[s], 1)))
                die("llama_decode failed on a generated token of ", path);
        }
        printf("],\n \"greedy\": ");
        print_ids(gen, n_gen);
        printf("}");
        free(gen);
        free(ids);
        llama_free(ctx);
    }
    printf("\n],\n\"tokenize\": [");
    for (int i = 0; i < n_corpus; i++) {
        llama_token *a, *b;
        int na = tokenize(vocab, corpus[i], true, &a);
        int nb = tokenize(vocab, corpus[i], false, &b);
        printf("%s\n{\"text\": ", i ? "," : "");
        print_string(corpus[i]);
        printf(", \"ids\": ");
        print_ids(a, na);
        printf(", \"ids_no_parse_special\": ");
        print_ids(b, nb);
        printf("}");
        free(a);
        free(b);
    }
    printf("%s]\n}\n", n_corpus ? "\n" : "");
    free(idx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
