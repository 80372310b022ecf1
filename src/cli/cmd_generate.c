/*
 * cmd_generate - `weld generate`: load a model, encode a prompt (optionally through the
 * model's chat template), and stream a continuation to stdout.
 *
 * stdout gets the prompt (unless --no-echo) and then the generated text as it streams,
 * through the incremental detokenizer so no half UTF-8 character is ever written; logs and
 * the closing speed line go to stderr. One sequence runs as a batch of one through the
 * runner: the prompt as one prefill step, then one-token decode steps. Generation stops at
 * an end-of-generation token (unless --ignore-eos), after -n tokens, or at the context
 * limit.
 */
#include "cli/cli.h"
#include "core/alloc.h"
#include "core/err.h"
#include "core/json.h"
#include "core/log.h"
#include "core/progress.h"
#include "engine/sampler.h"
#include "exec/runner.h"
#include "model/model.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

struct gen_opts {
    const char *model, *prompt, *system;
    int n_predict, ctx;
    struct sampler_params sp;
    int64_t seed;
    bool chat, no_echo, ignore_eos, no_special, show_ids;
};

/* Load the tokenizer that belongs to a model: GGUF metadata, or the HF directory's files. */
static int load_tokenizer(const struct model *m, struct tokenizer **tok, struct weld_err *e)
{
    if (m->source == MODEL_SRC_GGUF)
        return tokenizer_load_gguf(tok, m->gguf, e);
    return tokenizer_load_hf(tok, m->dir, e);
}

/* Render the prompt through the model's chat template as one user turn. */
static int render_chat(const struct tokenizer *tok, const struct gen_opts *o, char **out,
                       struct weld_err *e)
{
    const char *src = tokenizer_chat_template(tok);
    if (!src)
        return err_set(e, WELD_ERR_NOT_FOUND,
                       "the model has no chat template (tokenizer.chat_template / "
                       "tokenizer_config.json chat_template); run without --chat");
    struct chat_template *t = NULL;
    int rc = chat_template_parse(&t, src, strlen(src), e);
    if (rc != WELD_OK)
        return err_prefix(e, "chat template");
    json_t *ctx = json_object(), *msgs = json_array();
    if (o->system)
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", o->system));
    json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", o->prompt));
    json_object_set_new(ctx, "messages", msgs);
    json_object_set_new(ctx, "add_generation_prompt", json_true());
    const char *bos = tokenizer_bos_text(tok), *eos = tokenizer_eos_text(tok);
    if (bos)
        json_object_set_new(ctx, "bos_token", json_string(bos));
    if (eos)
        json_object_set_new(ctx, "eos_token", json_string(eos));
    rc = chat_template_render(t, ctx, out, NULL, e);
    if (rc != WELD_OK)
        err_prefix(e, "chat template");
    json_decref(ctx);
    chat_template_free(t);
    return rc;
}

/* Encode the prompt. A rendered chat prompt that already starts with BOS is encoded without
   the post-processor's special tokens, so it never gets two BOS tokens. */
static int encode_prompt(const struct tokenizer *tok, const char *text, bool add_special,
                         int32_t **ids, size_t *n, struct weld_err *e)
{
    const char *bos = tokenizer_bos_text(tok);
    if (add_special && bos && *bos && !strncmp(text, bos, strlen(bos)))
        add_special = false;
    return tokenizer_encode(tok, text, strlen(text), add_special, true, ids, n, e);
}

static void emit(const char *s, size_t n)
{
    if (n) {
        fwrite(s, 1, n, stdout);
        fflush(stdout);
    }
}

static int generate(struct runner *r, const struct tokenizer *tok, struct sampler *smp,
                    const int32_t *prompt, int n_prompt, const struct gen_opts *o,
                    struct weld_err *e)
{
    int n_vocab = runner_n_vocab(r), max_ctx = runner_max_ctx(r);
    float *logits = wmalloc((size_t)n_vocab * sizeof *logits);
    struct detok *dt = detok_create(tok, true);
    int rc = WELD_OK, n_gen = 0;
    if (!logits || !dt) {
        rc = err_set(e, WELD_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < n_prompt; i++)
        sampler_accept(smp, prompt[i], true);

    double t0 = time_now(), t_prefill = 0;
    struct batch_seq s = {.seq_id = 0, .tokens = prompt, .n_tokens = n_prompt, .pos = 0};
    struct batch b = {.seqs = &s, .n_seqs = 1};
    int32_t tok_id;
    char buf[4096];
    while (n_gen < o->n_predict) {
        rc = runner_forward(r, &b, logits, e);
        if (rc != WELD_OK)
            goto out;
        if (n_gen == 0)
            t_prefill = time_now() - t0;
        int next;
        rc = sampler_sample(smp, logits, &next, e);
        if (rc != WELD_OK)
            goto out;
        n_gen++;
        if (!o->ignore_eos && tokenizer_is_eog(tok, next))
            break;
        sampler_accept(smp, next, false);
        if (o->show_ids)
            fprintf(stderr, "%d ", next);
        emit(buf, detok_push(dt, next, buf, sizeof buf));
        if (s.pos + s.n_tokens >= max_ctx) {
            log_warn("stopped at the context limit (%d tokens)", max_ctx);
            break;
        }
        tok_id = next;
        s.pos += s.n_tokens;
        s.tokens = &tok_id;
        s.n_tokens = 1;
    }
    size_t k;
    while ((k = detok_flush(dt, buf, sizeof buf)) > 0)
        emit(buf, k);
    if (!o->no_echo || n_gen)
        emit("\n", 1);
    double t_all = time_now() - t0, t_dec = t_all - t_prefill;
    if (o->show_ids)
        fprintf(stderr, "\n");
    fprintf(stderr,
            "weld: prompt %d tokens in %.3f s (%.1f tok/s); generated %d tokens in %.3f s "
            "(%.1f tok/s)\n",
            n_prompt, t_prefill, t_prefill > 0 ? n_prompt / t_prefill : 0.0, n_gen, t_dec,
            n_gen > 1 && t_dec > 0 ? (n_gen - 1) / t_dec : 0.0);
out:
    detok_free(dt);
    wfree(logits);
    return rc;
}

int cmd_generate(int argc, char **argv)
{
    struct gen_opts o = {.n_predict = 128, .ctx = 0, .seed = -1};
    o.sp = sampler_params_default();
    o.sp.temperature = 0.8f;
    o.sp.top_k = 40;
    o.sp.top_p = 0.95f;
    o.sp.min_p = 0.05f;
    const struct cli_opt opts[] = {
        {"model", 'm', OPT_STR, &o.model, "MODEL", "GGUF file or Hugging Face directory (required)"},
        {"prompt", 'p', OPT_STR, &o.prompt, "TEXT", "prompt text (required)"},
        {"n-predict", 'n', OPT_INT, &o.n_predict, "N", "tokens to generate (default 128)"},
        {"temp", 0, OPT_FLOAT, &o.sp.temperature, "T", "temperature; 0 = greedy (default 0.8)"},
        {"top-k", 0, OPT_INT, &o.sp.top_k, "K", "keep the K most likely tokens; 0 = off (default 40)"},
        {"top-p", 0, OPT_FLOAT, &o.sp.top_p, "P", "nucleus sampling mass; 1 = off (default 0.95)"},
        {"min-p", 0, OPT_FLOAT, &o.sp.min_p, "P", "drop tokens below P x the top probability; 0 = off (default 0.05)"},
        {"repeat-penalty", 0, OPT_FLOAT, &o.sp.repetition_penalty, "R", "repetition penalty; 1 = off (default 1)"},
        {"frequency-penalty", 0, OPT_FLOAT, &o.sp.frequency_penalty, "F", "frequency penalty (default 0)"},
        {"presence-penalty", 0, OPT_FLOAT, &o.sp.presence_penalty, "P", "presence penalty (default 0)"},
        {"seed", 's', OPT_I64, &o.seed, "S", "random seed; the same seed gives the same output (default: random, printed)"},
        {"chat", 0, OPT_FLAG, &o.chat, NULL, "wrap the prompt in the model's chat template as a user turn"},
        {"system", 0, OPT_STR, &o.system, "TEXT", "system message for --chat"},
        {"ctx", 'c', OPT_INT, &o.ctx, "N", "context length (default: the model's, at most 4096)"},
        {"no-echo", 0, OPT_FLAG, &o.no_echo, NULL, "print only the continuation, not the prompt"},
        {"ignore-eos", 0, OPT_FLAG, &o.ignore_eos, NULL, "keep generating after end-of-generation tokens"},
        {"no-special", 0, OPT_FLAG, &o.no_special, NULL, "do not add BOS/special tokens to the prompt"},
        {"show-ids", 0, OPT_FLAG, &o.show_ids, NULL, "also print the generated token ids to stderr"},
    };
    const char *pos[1];
    int n_pos;
    int prc = cli_parse(argc, argv, "generate -m MODEL -p PROMPT [options]",
                        "Generate text from a prompt. The prompt and then the continuation go to stdout\n"
                        "as they stream; logs and the speed line go to stderr.",
                        opts, (int)(sizeof opts / sizeof opts[0]), pos, 0, &n_pos);
    if (prc)
        return prc == 1 ? 0 : 2;
    if (!o.model || !o.prompt) {
        fprintf(stderr, "weld generate: -m MODEL and -p PROMPT are required (see --help)\n");
        return 2;
    }
    if (o.n_predict < 0 || o.ctx < 0) {
        fprintf(stderr, "weld generate: -n and --ctx must not be negative\n");
        return 2;
    }
    if (o.seed < 0) {
        o.sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
        if (o.sp.temperature > 0)
            log_info("seed %llu", (unsigned long long)o.sp.seed);
    } else {
        o.sp.seed = (uint64_t)o.seed;
    }

    struct weld_err e;
    err_clear(&e);
    struct model *m = NULL;
    struct tokenizer *tok = NULL;
    struct runner *r = NULL;
    struct sampler *smp = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = sampler_params_check(&o.sp, &e);
    if (rc == WELD_OK)
        rc = model_load(&m, o.model, &e);
    if (rc == WELD_OK)
        rc = load_tokenizer(m, &tok, &e);
    if (rc == WELD_OK && o.chat)
        rc = render_chat(tok, &o, &text, &e);
    if (rc == WELD_OK)
        rc = encode_prompt(tok, text ? text : o.prompt, !o.no_special, &ids, &n_ids, &e);
    if (rc == WELD_OK && n_ids == 0)
        rc = err_set(&e, WELD_ERR_INVALID_ARG, "the prompt encodes to no tokens; give a prompt");
    int ctx = o.ctx;
    if (rc == WELD_OK && ctx == 0)
        ctx = m->cfg.max_ctx > 0 && m->cfg.max_ctx < 4096 ? m->cfg.max_ctx : 4096;
    if (rc == WELD_OK && (int)n_ids >= ctx)
        rc = err_set(&e, WELD_ERR_LIMIT, "the prompt has %zu tokens; the context holds %d (--ctx)",
                     n_ids, ctx);
    if (rc == WELD_OK)
        rc = runner_create(&r, m, 1, ctx, &e);
    if (rc == WELD_OK)
        rc = sampler_create(&smp, &o.sp, runner_n_vocab(r), &e);
    if (rc == WELD_OK) {
        log_debug("%s", runner_describe(r));
        if (!o.no_echo) {
            emit(o.prompt, strlen(o.prompt));
        }
        rc = generate(r, tok, smp, ids, (int)n_ids, &o, &e);
    }
    if (rc != WELD_OK)
        fprintf(stderr, "weld generate: %s\n", e.msg);
    sampler_free(smp);
    runner_free(r);
    wfree(ids);
    wfree(text);
    tokenizer_free(tok);
    model_free(m);
    return rc == WELD_OK ? 0 : 1;
}
