/*
 * cmd_info - `weld info MODEL`: what a GGUF file or Hugging Face directory holds, read
 * straight from the files (format/ readers, model config, tokmeta) without loading the
 * model for inference: architecture and config, parameter count, tensors by type (every
 * tensor with --tensors), tokenizer, chat template (first lines; all with --template),
 * and memory: weight bytes plus the f16 KV cache per token and at the trained context.
 * Sparse models add their expert and latent-attention settings, the parameters one token
 * runs through (dense parts, n_expert_used of the routed experts, shared experts; not the
 * MTP layers), and for MLA what per-head K and V would take beside the latent cache. The
 * KV bytes come from exec (kv_shape_for, backend_kv_block_bytes): the engine's own rule.
 *
 * The tokenizer is also loaded as generate and serve load it (tokenizer/), so info says
 * what they will do: "usable yes", or "usable no" with their error and a warning; a
 * tokenizer.json whose pre-tokenizer is no llama.cpp family shows as "custom" (generate and
 * serve run it as written; only conversion to GGUF cannot name it), with a warning.
 *
 * Everything goes to stdout (warnings to stderr); a file that cannot be read gives one
 * error line on stderr and exit status 1.
 */
#include "cli/cli.h"
#include "core/err.h"
#include "exec/backend.h"
#include "exec/kv.h"
#include "exec/weights.h"
#include "format/dtype.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/config.h"
#include "model/names.h"
#include "model/resolve.h"
#include "model/tokmeta.h"
#include "tokenizer/tokenizer.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* One tensor as both formats describe it: GGUF ne[] order. */
struct info_tensor {
    const char *name;
    int type;
    int n_dims;
    int64_t ne[8];
    size_t nbytes;
};

struct info {
    const char *path;
    int hf;
    struct gguf_file *g;
    struct st_set *st;
    struct model_config c;
    struct tokmeta *tok;
    char tok_error[512];   /* why generate / serve cannot load the tokenizer, or "" */
    int n_tensors;
    struct info_tensor *t;
};

static void human(double bytes, char *buf, size_t n)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (bytes >= 1024 && i < 4)
        bytes /= 1024, i++;
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", bytes, u[i]);
}

static int info_open_gguf(struct info *in, struct weld_err *e)
{
    int rc = gguf_open(&in->g, in->path, e);
    if (rc || (rc = model_config_from_gguf(in->g, &in->c, e)))
        return rc;
    in->c.tied_embeddings = gguf_find_tensor(in->g, "output.weight") == NULL;
    in->t = calloc(in->g->n_tensors ? in->g->n_tensors : 1, sizeof *in->t);
    if (!in->t)
        return err_set(e, WELD_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < in->g->n_tensors; i++) {
        const struct gguf_tensor *s = &in->g->tensors[i];
        struct info_tensor *t = &in->t[in->n_tensors++];
        t->name = s->name, t->type = s->type, t->n_dims = s->n_dims, t->nbytes = s->nbytes;
        for (int d = 0; d < s->n_dims; d++)
            t->ne[d] = s->ne[d];
    }
    rc = tokmeta_from_gguf(&in->tok, in->g, e);
    return rc == WELD_ERR_NOT_FOUND ? WELD_OK : rc;
}

static int info_open_hf(struct info *in, struct weld_err *e)
{
    int rc = model_config_from_hf(in->path, &in->c, e);
    if (rc || (rc = st_open_dir(&in->st, in->path, e)))
        return rc;
    in->t = calloc(in->st->n_tensors ? (size_t)in->st->n_tensors : 1, sizeof *in->t);
    if (!in->t)
        return err_set(e, WELD_ERR_NOMEM, "out of memory");
    for (int i = 0; i < in->st->n_tensors; i++) {
        const struct st_tensor *s = &in->st->tensors[i];
        struct info_tensor *t = &in->t[in->n_tensors++];
        t->name = s->name, t->type = s->dtype, t->n_dims = s->n_dims, t->nbytes = s->nbytes;
        for (int d = 0; d < s->n_dims; d++)
            t->ne[d] = s->shape[s->n_dims - 1 - d];
    }
    char p[4200];
    snprintf(p, sizeof p, "%s/tokenizer.json", in->path);
    if (access(p, R_OK) == 0)
        return tokmeta_from_hf(&in->tok, in->path, TOKMETA_PRE_ANY, in->c.n_vocab, e);
    return WELD_OK;
}

/* Load the tokenizer the way the engine does; its error, if any, into in->tok_error. */
static void info_check_tokenizer(struct info *in)
{
    struct tokenizer *t = NULL;
    struct weld_err e = {0};
    int rc = in->hf ? tokenizer_load_hf(&t, in->path, &e) : tokenizer_load_gguf(&t, in->g, &e);
    if (rc)
        snprintf(in->tok_error, sizeof in->tok_error, "%s", e.msg);
    tokenizer_free(t);
}

static void print_config(const struct model_config *c)
{
    printf("architecture: %s\n", model_arch_name(c->arch));
    if (c->name[0])
        printf("  name               %s\n", c->name);
    printf("  vocab              %d\n  dim                %d\n  layers             %d\n"
           "  heads              %d\n  kv heads           %d\n  head dim           %d\n"
           "  ffn dim            %d\n  context            %d\n  rope dim           %d\n"
           "  rope theta         %g\n  norm eps           %g\n",
           c->n_vocab, c->dim, c->n_layer, c->n_head, c->n_kv_head, c->head_dim, c->ffn_dim,
           c->max_ctx, c->rope_dim, (double)c->rope_theta, (double)c->norm_eps);
    if (c->rope_scaling == ROPE_SCALING_LINEAR)
        printf("  rope scaling       linear, factor %g\n", (double)c->rope_factor);
    else if (c->rope_scaling == ROPE_SCALING_LLAMA3)
        printf("  rope scaling       llama3, factor %g, low %g, high %g, original context %d\n",
               (double)c->rope_factor, (double)c->rope_low_freq_factor,
               (double)c->rope_high_freq_factor, c->rope_orig_ctx);
    else if (c->rope_scaling == ROPE_SCALING_YARN)
        printf("  rope scaling       yarn, factor %g, original context %d, mscale %g, beta fast "
               "%g, beta slow %g\n",
               (double)c->rope_factor, c->rope_orig_ctx, (double)(c->yarn_log_mul / 0.1f),
               (double)c->yarn_beta_fast, (double)c->yarn_beta_slow);
    else
        printf("  rope scaling       none\n");
    printf("  tied embeddings    %s\n  qkv bias           %s\n  qk norm            %s\n",
           c->tied_embeddings ? "yes" : "no", c->qkv_bias ? "yes" : "no",
           c->qk_norm ? "yes" : "no");
    if (c->sliding_window)
        printf("  sliding window     %d\n", c->sliding_window);
    if (c->kv_lora_rank > 0) {
        printf("  attention          multi-head latent (MLA)\n");
        if (c->q_lora_rank > 0)
            printf("  q lora rank        %d\n", c->q_lora_rank);
        else
            printf("  q lora rank        none (plain attn_q)\n");
        printf("  kv lora rank       %d\n  qk nope dim        %d\n  qk rope dim        %d\n"
               "  v head dim         %d\n",
               c->kv_lora_rank, c->qk_nope_dim, c->rope_dim, c->v_head_dim);
    }
    if (c->n_expert > 0) {
        printf("  experts            %d routed, %d used per token, ffn %d\n", c->n_expert,
               c->n_expert_used, c->moe_ffn_dim);
        if (c->shared_ffn_dim > 0)
            printf("  shared experts     %d, ffn %d%s\n",
                   c->n_shared_expert ? c->n_shared_expert : 1, c->shared_ffn_dim,
                   c->shared_gate ? " (sigmoid-gated)" : "");
        else
            printf("  shared experts     none\n");
        if (c->n_dense_lead > 0)
            printf("  dense layers       %d leading (ffn %d)\n", c->n_dense_lead, c->ffn_dim);
        else
            printf("  dense layers       none (every layer routes)\n");
        printf("  gating             %s", c->gating == MOE_GATING_SIGMOID ? "sigmoid" : "softmax");
        if (c->n_group > 1 && c->topk_group < c->n_group)
            printf(", %d groups (%d used)", c->n_group, c->topk_group);
        printf(", bias %s, renormalise %s, scale %g\n", c->expert_bias ? "yes" : "no",
               c->expert_norm ? "yes" : "no", (double)c->expert_scale);
    }
    if (c->n_nextn > 0)
        printf("  mtp layers         %d (loaded, not run)\n", c->n_nextn);
}

/* Layer of a GGUF ("blk.N.") or HF ("model.layers.N.") tensor name, or -1. */
static int tensor_layer(const char *name)
{
    int l = -1;
    if (sscanf(name, "blk.%d.", &l) == 1 || sscanf(name, "model.layers.%d.", &l) == 1)
        return l;
    return -1;
}

/* Parameters one token runs through: every tensor but the MTP layers', and of the routed
   experts only n_expert_used of n_expert (stacked GGUF tensors or HF per-expert ones). */
static double active_params(const struct info *in)
{
    const struct model_config *c = &in->c;
    double n = 0;
    for (int i = 0; i < in->n_tensors; i++) {
        const struct info_tensor *t = &in->t[i];
        double k = 1;
        for (int d = 0; d < t->n_dims; d++)
            k *= (double)t->ne[d];
        int layer, expert;
        enum expert_proj p;
        if (tensor_layer(t->name) >= c->n_layer)
            continue;
        if (tensor_name_expert_parse(t->name, &layer, &expert, &p) == 0)
            k = k * c->n_expert_used / c->n_expert;
        n += k;
    }
    return n;
}

static void print_tensors(const struct info *in, int all, uint64_t *weight_bytes)
{
    uint64_t n_params = 0, bytes = 0, per_type[DT_COUNT + 1] = {0}, count[DT_COUNT + 1] = {0};
    for (int i = 0; i < in->n_tensors; i++) {
        const struct info_tensor *t = &in->t[i];
        uint64_t n = 1;
        for (int d = 0; d < t->n_dims; d++)
            n *= (uint64_t)t->ne[d];
        n_params += n;
        bytes += t->nbytes;
        int k = t->type >= 0 && t->type < DT_COUNT ? t->type : DT_COUNT;
        per_type[k] += t->nbytes;
        count[k]++;
    }
    char hb[32];
    human((double)bytes, hb, sizeof hb);
    printf("parameters: %" PRIu64 " (%.2fM)\n", n_params, (double)n_params / 1e6);
    if (in->c.n_expert > 0) {
        double act = active_params(in);
        printf("  active per token   %.0f (%.2fM, %.1f%%): dense parts, %d of %d routed "
               "experts%s\n",
               act, act / 1e6, n_params ? 100.0 * act / (double)n_params : 0.0, in->c.n_expert_used,
               in->c.n_expert, in->c.shared_ffn_dim > 0 ? ", shared experts" : "");
    }
    printf("tensors: %d, %s\n", in->n_tensors, hb);
    for (int k = 0; k <= DT_COUNT; k++) {
        if (!count[k])
            continue;
        human((double)per_type[k], hb, sizeof hb);
        printf("  %-8s %5" PRIu64 " tensors  %s\n", k < DT_COUNT ? dtype_name(k) : "other",
               count[k], hb);
    }
    for (int i = 0; all && i < in->n_tensors; i++) {
        const struct info_tensor *t = &in->t[i];
        char shape[96] = "";
        size_t used = 0;
        for (int d = 0; d < t->n_dims && used < sizeof shape; d++)
            used += (size_t)snprintf(shape + used, sizeof shape - used, d ? " x %" PRId64 : "%" PRId64,
                                     t->ne[d]);
        printf("  %-40s %-6s %-22s %zu\n", t->name, t->type >= 0 ? dtype_name(t->type) : "?",
               shape, t->nbytes);
    }
    *weight_bytes = bytes;
}

static void print_token(const struct tokmeta *t, const char *what, int64_t id)
{
    if (id >= 0)
        printf("  %-18s %" PRId64 " '%s'\n", what, id, t->tokens[id]);
    else
        printf("  %-18s none\n", what);
}

static void print_tokenizer(const struct info *in, int whole_template)
{
    const struct tokmeta *t = in->tok;
    if (!t) {
        printf("tokenizer: none\n");
        return;
    }
    printf("tokenizer: %s", t->model);
    if (strcmp(t->model, "llama"))
        printf(" (byte-level BPE, pre-tokenizer %s)\n", t->pre);
    else
        printf(" (SentencePiece-style BPE with byte fallback)\n");
    if (in->tok_error[0]) {
        printf("  usable             no: %s\n", in->tok_error);
        fprintf(stderr, "weld info: warning: generate and serve cannot use this tokenizer: "
                "%s\n", in->tok_error);
    } else {
        printf("  usable             yes\n");
    }
    if (!in->tok_error[0] && !strcmp(t->pre, "custom"))
        fprintf(stderr, "weld info: warning: the pre-tokenizer of %s/tokenizer.json is not one "
                "of llama.cpp's families (llama-bpe, qwen2, deepseek-v3, default): generate "
                "and serve run it as tokenizer.json defines it, but `weld convert` to GGUF "
                "cannot name it\n", in->path);
    printf("  vocab              %" PRId64 "\n", t->n_tokens);
    if (t->n_merges)
        printf("  merges             %" PRId64 "\n", t->n_merges);
    print_token(t, "bos", t->bos);
    print_token(t, "eos", t->eos);
    print_token(t, "unk", t->unk);
    print_token(t, "pad", t->pad);
    printf("  add bos            %s\n", tokmeta_effective_add_bos(t) ? "yes" : "no");
    if (!t->chat_template) {
        printf("chat template: none\n");
        return;
    }
    const char *s = t->chat_template;
    int lines = 0, shown = 0;
    for (const char *p = s; *p; p++)
        lines += *p == '\n';
    lines += s[0] && s[strlen(s) - 1] != '\n';
    printf("chat template: %zu bytes, %d lines\n", strlen(s), lines);
    while (*s && (whole_template || shown < 8)) {
        const char *nl = strchr(s, '\n');
        int len = nl ? (int)(nl - s) : (int)strlen(s);
        if (!whole_template && len > 160)
            printf("  | %.157s...\n", s);
        else
            printf("  | %.*s\n", len, s);
        shown++;
        s = nl ? nl + 1 : s + len;
    }
    if (*s)
        printf("  (%d more lines; --template shows all)\n", lines - shown);
}

/* The KV cache per token as the engine sizes it (exec's kv_shape_for / block bytes, f16,
   one-token blocks); MLA also shows what per-head K and V would take. */
static void print_memory(const struct model_config *c, uint64_t weights)
{
    uint64_t kv = backend_kv_block_bytes(c, DT_F16, 1);
    char a[32], b[32], d[32];
    human((double)weights, a, sizeof a);
    human((double)kv * (double)c->max_ctx, b, sizeof b);
    human((double)weights + (double)kv * (double)c->max_ctx, d, sizeof d);
    printf("memory:\n  weights            %s\n  kv cache (f16)     %" PRIu64 " bytes per token; "
           "%s at context %d\n",
           a, kv, b, c->max_ctx);
    int kv_dim, hd;
    bool latent;
    kv_shape_for(c, &kv_dim, &hd, &latent);
    if (latent) {
        uint64_t per_head = (uint64_t)c->n_layer * (uint64_t)c->n_head *
                            (uint64_t)(c->head_dim + c->v_head_dim) * 2;
        printf("  kv layout          latent: one row of %d (kv_lora_rank %d + rope %d) per layer, "
               "keys only\n  per-head kv (f16)  %" PRIu64 " bytes per token (K %d + V %d for "
               "each of %d heads): %.1fx the latent cache\n",
               kv_dim, c->kv_lora_rank, c->rope_dim, per_head, c->head_dim, c->v_head_dim,
               c->n_head, kv ? (double)per_head / (double)kv : 0.0);
    } else {
        printf("  kv layout          K and V, %d heads of %d per layer\n", c->n_kv_head,
               c->head_dim);
    }
    printf("  total at context   %s\n", d);
}

/* How a matrix is cut over tensor-parallel ranks (exec_weights_create_shard): by heads,
   by ffn rows, by vocabulary rows, or not at all (held whole: norms, embeddings read in
   place). */
enum tp_cut { CUT_NONE, CUT_HEADS, CUT_FFN, CUT_VOCAB, CUT_EXPERTS };

static enum tp_cut tp_cut_of(const char *name, bool tied)
{
    if (strstr(name, "_exps.") || strstr(name, ".experts.")) /* routed experts, placed whole */
        return CUT_EXPERTS;
    static const char *const heads[] = {"attn_q.", "attn_k.", "attn_v.", "attn_output.",
                                        "q_proj.", "k_proj.", "v_proj.", "o_proj."};
    static const char *const ffn[] = {"ffn_gate.",  "ffn_up.",  "ffn_down.",
                                      "gate_proj.", "up_proj.", "down_proj."};
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++)
        if (strstr(name, heads[i]))
            return CUT_HEADS;
    for (size_t i = 0; i < sizeof ffn / sizeof ffn[0]; i++)
        if (strstr(name, ffn[i]))
            return CUT_FFN;
    if (!strcmp(name, "output.weight") || !strcmp(name, "lm_head.weight") ||
        (tied && (!strcmp(name, "token_embd.weight") || strstr(name, "embed_tokens."))))
        return CUT_VOCAB;
    return CUT_NONE;
}

/* --tensor-parallel-size N: each rank's weight bytes (its heads, ffn rows and vocabulary
   rows of every matrix; what is held whole, each rank holds) and KV bytes per token. */
static void print_tp(const struct info *in, int n)
{
    const struct model_config *c = &in->c;
    printf("tensor parallel %d (per rank):\n", n);
    if (c->kv_lora_rank > 0 || c->n_head % n || c->n_kv_head % n || c->n_vocab < 16 * n ||
        (c->n_expert > 0 && c->n_expert % n)) {
        printf("  not possible: %s\n", c->kv_lora_rank > 0   ? "latent attention"
                                       : c->n_vocab < 16 * n ? "vocabulary too small"
                                       : c->n_expert % n     ? "experts do not divide"
                                                             : "heads do not divide");
        return;
    }
    if (c->n_expert > 0)
        printf("  (experts placed whole: --enable-expert-parallel)\n");
    int block = 1; /* the largest block of a down matrix sets the ffn cut */
    for (int i = 0; i < in->n_tensors; i++)
        if (tp_cut_of(in->t[i].name, false) == CUT_FFN && dtype_get(in->t[i].type) &&
            dtype_get(in->t[i].type)->block_size > block)
            block = dtype_get(in->t[i].type)->block_size;
    const uint64_t kv = backend_kv_block_bytes(c, DT_F16, 1) / (uint64_t)n;
    for (int r = 0; r < n; r++) {
        const int f0 = exec_kparts_ffn_cut(c->ffn_dim, block, r, n);
        const int f1 = exec_kparts_ffn_cut(c->ffn_dim, block, r + 1, n);
        const int v0 = exec_tp_vocab_cut(c->n_vocab, r, n),
                  v1 = exec_tp_vocab_cut(c->n_vocab, r + 1, n);
        double bytes = 0;
        for (int i = 0; i < in->n_tensors; i++) {
            const struct info_tensor *t = &in->t[i];
            switch (tp_cut_of(t->name, c->tied_embeddings)) {
            case CUT_HEADS: bytes += (double)t->nbytes / n; break;
            case CUT_FFN: bytes += (double)t->nbytes * (f1 - f0) / c->ffn_dim; break;
            case CUT_VOCAB: bytes += (double)t->nbytes * (v1 - v0) / c->n_vocab; break;
            case CUT_EXPERTS: bytes += (double)t->nbytes / n; break;
            default: bytes += (double)t->nbytes;
            }
        }
        char b[32];
        human(bytes, b, sizeof b);
        char ex[48] = "";
        if (c->n_expert > 0)
            snprintf(ex, sizeof ex, ", experts %d-%d", c->n_expert * r / n,
                     c->n_expert * (r + 1) / n - 1);
        printf("  rank %-2d            weights %s (query heads %d-%d, ffn rows %d-%d%s, vocab "
               "%d-%d); kv cache (f16) %" PRIu64 " bytes per token\n",
               r, b, c->n_head / n * r, c->n_head / n * (r + 1) - 1, f0, f1 - 1, ex, v0, v1 - 1,
               kv);
    }
}

int cmd_info(int argc, char **argv)
{
    bool tensors = false, whole_template = false;
    int tp = 0;
    const struct cli_opt opts[] = {
        {"tensors", 0, OPT_FLAG, &tensors, NULL, "list every tensor: name, type, shape, bytes"},
        {"template", 0, OPT_FLAG, &whole_template, NULL, "print the whole chat template"},
        {"tensor-parallel-size", 0, OPT_INT, &tp, "N",
         "also each of N ranks' weight and KV bytes (-tp)"},
    };
    const char *pos[1];
    int n_pos = 0;
    int r = cli_parse(argc, argv, "info MODEL [--tensors] [--template] [-tp N]",
                      "Show a model's architecture, parameters, tensors, tokenizer, chat "
                      "template and memory needs.\nMODEL is a GGUF file or a Hugging Face "
                      "directory.",
                      opts, 3, pos, 1, &n_pos);
    if (r)
        return r == 1 ? 0 : 2;
    if (n_pos != 1) {
        fprintf(stderr, "weld info: expected one MODEL (see weld info --help)\n");
        return 2;
    }
    struct info in = {.path = pos[0]};
    struct weld_err e = {0};
    struct stat st;
    char where[4096];
    if (model_resolve_path(pos[0], where, sizeof where, &e) == WELD_OK && stat(where, &st))
        err_set(&e, WELD_ERR_IO, "%s: no such file or directory", where);
    if (e.status) {
        fprintf(stderr, "weld info: %s\n", e.msg);
        return 1;
    }
    in.path = where;
    in.hf = S_ISDIR(st.st_mode);
    int rc = in.hf ? info_open_hf(&in, &e) : info_open_gguf(&in, &e);
    if (rc == WELD_OK) {
        uint64_t wbytes = 0;
        printf("model: %s (%s)\n", in.path, in.hf ? "Hugging Face directory" : "GGUF");
        print_config(&in.c);
        print_tensors(&in, tensors, &wbytes);
        if (in.tok)
            info_check_tokenizer(&in);
        print_tokenizer(&in, whole_template);
        print_memory(&in.c, wbytes);
        if (tp > 1)
            print_tp(&in, tp);
    } else {
        fprintf(stderr, "weld info: %s\n", e.msg);
    }
    tokmeta_free(in.tok);
    free(in.t);
    gguf_close(in.g);
    st_close(in.st);
    return rc ? 1 : 0;
}
