/*
 * cmd_generate - `weld generate`: one request through the serving engine, streamed.
 *
 * stdout gets the prompt (unless --no-echo) and then the generated text as the engine's
 * on_delta callback delivers it (whole UTF-8 characters only); logs and the closing speed
 * line go to stderr. The request runs through exactly the path a server request takes
 * (engine.h: scheduler, paged KV cache, sampler, detokenizer, stop logic), so the CLI and
 * the batch and server paths can never disagree on tokens. --chat wraps the prompt as a
 * user turn (after an optional --system turn) in the model's chat template, or the one
 * --chat-template names (a file or a builtin); a model without one is refused before
 * anything is printed. -i hands the whole command line to `weld chat` (cmd_chat.c).
 */
#include "cli/cli.h"
#include "core/alloc.h"
#include "core/err.h"
#include "core/json.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

struct gen_opts {
    const char *model, *prompt, *system, *chat_template;
    int n_predict, ctx, threads;
    struct sampler_params sp;
    int64_t seed;
    bool chat, no_echo, ignore_eos, no_special, show_ids, interactive;
};

struct gen_state {
    const struct gen_opts *o;
    struct request_result res;
    char error[512];
    bool done;
};

static void on_delta(void *user, uint64_t req_id, int seq_index, const char *text, size_t len,
                     const int32_t *tokens, int n_tokens, const struct request_logprob *lp)
{
    struct gen_state *g = user;
    (void)req_id, (void)seq_index, (void)lp;
    if (len) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    if (g->o->show_ids)
        for (int i = 0; i < n_tokens; i++)
            fprintf(stderr, "%d ", tokens[i]);
}

static void on_finish(void *user, uint64_t req_id, int seq_index,
                      const struct request_result *r)
{
    struct gen_state *g = user;
    (void)req_id, (void)seq_index;
    g->res = *r;
    g->done = true;
    if (r->error)
        snprintf(g->error, sizeof g->error, "%s", r->error);
    g->res.error = r->error ? g->error : NULL;
    g->res.stop_reason = NULL;
}

/* Run the request to completion. */
static int run(struct engine *eng, const struct request_params *rp, struct gen_state *g,
               struct weld_err *e)
{
    struct request_callbacks cb = {.user = g, .on_delta = on_delta, .on_finish = on_finish};
    uint64_t id;
    int rc = engine_add_request(eng, rp, &cb, &id, e);
    while (rc == WELD_OK && engine_has_work(eng))
        rc = engine_step(eng, e);
    if (rc != WELD_OK)
        return rc;
    if (g->res.finish == REQUEST_FINISH_ERROR)
        return err_set(e, WELD_ERR_INTERNAL, "%s", g->res.error ? g->res.error : "failed");
    if (g->o->show_ids)
        fputc('\n', stderr);
    if (g->res.finish == REQUEST_FINISH_LENGTH && g->res.n_generated_tokens < g->o->n_predict)
        log_warn("stopped at the context limit (--ctx %d)", g->o->ctx);
    return WELD_OK;
}

/* The closing speed line (stderr): prefill from arrival to the first token, then decode. */
static void print_speed(const struct request_result *r)
{
    double t_prefill = r->t_first_token, t_dec = r->t_total - r->t_first_token;
    int n_gen = r->n_generated_tokens;
    fprintf(stderr,
            "weld: prompt %d tokens in %.3f s (%.1f tok/s); generated %d tokens in %.3f s "
            "(%.1f tok/s)\n",
            r->n_prompt_tokens, t_prefill, t_prefill > 0 ? r->n_prompt_tokens / t_prefill : 0.0,
            n_gen, t_dec, n_gen > 1 && t_dec > 0 ? (n_gen - 1) / t_dec : 0.0);
}

static json_t *chat_messages(const struct gen_opts *o)
{
    json_t *msgs = json_array();
    if (o->system)
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", o->system));
    json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", o->prompt));
    return msgs;
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
        {"chat-template", 0, OPT_STR, &o.chat_template, "FILE|NAME", "Jinja chat template file or a builtin (chatml, llama2, llama3, mistral, qwen, gemma) for --chat (implies it)"},
        {"interactive", 'i', OPT_FLAG, &o.interactive, NULL, "chat in the terminal: the same as `weld chat` (see weld chat --help)"},
        {"ctx", 'c', OPT_INT, &o.ctx, "N", "context length (default: the model's, at most 4096)"},
        {"threads", 't', OPT_INT, &o.threads, "N", "forward-pass threads (default: one per physical core, one for models of tiny steps)"},
        {"no-echo", 0, OPT_FLAG, &o.no_echo, NULL, "print only the continuation, not the prompt"},
        {"ignore-eos", 0, OPT_FLAG, &o.ignore_eos, NULL, "keep generating after end-of-generation tokens"},
        {"no-special", 0, OPT_FLAG, &o.no_special, NULL, "do not add BOS/special tokens to the prompt"},
        {"show-ids", 0, OPT_FLAG, &o.show_ids, NULL, "also print the generated token ids to stderr"},
    };
    /* -i: the conversation of `weld chat` (cmd_chat.c), which takes its own options */
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "-i") || !strcmp(argv[i], "--interactive"))
            return cmd_chat(argc, argv);
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
    if (o.n_predict < 0 || o.ctx < 0 || o.threads < 0) {
        fprintf(stderr, "weld generate: -n, --ctx and --threads must not be negative\n");
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
    struct engine *eng = NULL;
    json_t *msgs = NULL;
    char *tmpl = NULL;
    int rc = sampler_params_check(&o.sp, &e);
    if (rc == WELD_OK && o.chat_template) {
        o.chat = true;
        if ((rc = chat_template_load(o.chat_template, &tmpl, &e)))
            err_prefix(&e, "--chat-template");
    }
    if (rc == WELD_OK)
        rc = model_load(&m, o.model, &e);
    if (rc == WELD_OK) {
        if (o.ctx == 0)
            o.ctx = m->cfg.max_ctx > 0 && m->cfg.max_ctx < 4096 ? m->cfg.max_ctx : 4096;
        struct engine_params ep = engine_params_default();
        ep.model = m;
        ep.max_num_seqs = 1;
        ep.max_model_len = o.ctx;
        ep.quiet = true;
        ep.n_threads = o.threads;
        rc = engine_create(&eng, &ep, &e);
    }
    if (rc == WELD_OK && o.chat && !tmpl && !tokenizer_chat_template(engine_tokenizer(eng)))
        rc = err_set(&e, WELD_ERR_NOT_FOUND,
                     "%s has no chat template: give one with --chat-template FILE or a builtin "
                     "name (%s)", o.model, chat_template_builtin_names());
    if (rc == WELD_OK && o.n_predict > 0) {
        struct request_params rp = request_params_default();
        if (o.chat)
            rp.messages = msgs = chat_messages(&o);
        else
            rp.prompt = o.prompt;
        rp.chat_template = tmpl;
        rp.add_special_tokens = !o.no_special;
        rp.sampling = o.sp;
        rp.has_seed = true;
        rp.max_tokens = o.n_predict;
        rp.ignore_eos = o.ignore_eos;
        struct gen_state g = {.o = &o};
        if (!o.no_echo) {
            fputs(o.prompt, stdout);
            fflush(stdout);
        }
        rc = run(eng, &rp, &g, &e);
        if (rc == WELD_OK) {
            if (!o.no_echo || g.res.n_generated_tokens)
                fputc('\n', stdout);
            fflush(stdout);
            print_speed(&g.res);
        }
    }
    if (rc != WELD_OK)
        fprintf(stderr, "weld generate: %s\n", e.msg);
    json_decref(msgs);
    wfree(tmpl);
    engine_free(eng);
    model_free(m);
    return rc == WELD_OK ? 0 : 1;
}
