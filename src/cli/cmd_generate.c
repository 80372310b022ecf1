/*
 * cmd_generate - `weld generate`: one request through the serving engine, streamed.
 *
 * The prompt comes from -p TEXT, -f FILE, or standard input (-p -, or no -p/-f when stdin
 * is not a terminal), as llama-cli takes it; one trailing newline of a file or of stdin is
 * dropped. -n N generates at most N tokens; -n -1 until an end-of-generation token or a
 * full context; -n 0 only evaluates the prompt (one forward pass over it; the one token it
 * samples is discarded) and prints its statistics.
 *
 * Output discipline: stdout gets the prompt (unless --no-echo) and then the generated text
 * as the engine's on_delta callback delivers it (whole UTF-8 characters only), and ends
 * with a newline; everything else (seed, notices, the closing speed line, errors) goes to
 * stderr on lines of its own: log.h ends an unfinished text line first when stdout and
 * stderr are one terminal or file. Nothing is printed before the request is accepted, so
 * an error (bad model, --ctx, a prompt that cannot fit) comes alone.
 *
 * The request runs through exactly the path a server request takes (engine.h: scheduler,
 * paged KV cache, sampler, detokenizer, stop logic), so the CLI and the batch and server
 * paths can never disagree on tokens. --chat wraps the prompt as a user turn (after an
 * optional --system turn) in the model's chat template, or the one --chat-template names (a
 * file or a builtin); a model without one is refused before anything is printed. -i hands
 * the whole command line to `weld chat` (cmd_chat.c).
 */
#include "cli/cli.h"
#include "core/alloc.h"
#include "core/err.h"
#include "core/json.h"
#include "core/log.h"
#include "core/mfile.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "grammar/schema.h"
#include "model/model.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define GEN_MAX_PROMPT_BYTES (64u << 20) /* -f / stdin: larger is surely not a prompt */

struct gen_opts {
    const char *model, *prompt, *system, *file, *chat_template;
    int n_predict, ctx, threads;
    struct sampler_params sp;
    int64_t seed;
    bool chat, no_echo, ignore_eos, no_special, show_ids, interactive;
    const char *spec_config, *model_draft;
    const char *grammar, *grammar_file, *json_schema, *json_schema_file;
    struct cli_exec_opts exec;
};

struct gen_state {
    const struct gen_opts *o;
    struct request_result res;
    char error[512];
    bool done, printing; /* printing: on_delta writes stdout (not for -n 0) */
    bool wrote;          /* stdout got the echo or text: it gets a closing newline */
};

static void on_delta(void *user, uint64_t req_id, int seq_index, const char *text, size_t len,
                     const int32_t *tokens, int n_tokens, const struct request_logprob *lp)
{
    struct gen_state *g = user;
    (void)req_id, (void)seq_index, (void)lp;
    if (len && g->printing) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
        log_stdout_open(text[len - 1] != '\n');
        g->wrote = true;
    }
    if (g->o->show_ids && g->printing)
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

/* Text the user sees on stdout: the prompt echo, then the generated text. */
static void echo(const char *s)
{
    size_t n = strlen(s);
    fwrite(s, 1, n, stdout);
    fflush(stdout);
    if (n)
        log_stdout_open(s[n - 1] != '\n');
}

/* The engine's "cannot fit" refusal in the terms of this command's flags. */
static int prompt_limit_error(const struct engine *eng, const struct request_params *rp,
                              const struct gen_opts *o, struct weld_err *e)
{
    int32_t *ids = NULL;
    int n = 0;
    struct weld_err e2;
    if (request_encode_prompt(engine_tokenizer(eng), rp, &ids, &n, &e2) != WELD_OK || n <= o->ctx)
        n = 0;
    wfree(ids);
    int max_ctx = engine_model(eng)->cfg.max_ctx;
    if (!n)
        return WELD_ERR_LIMIT; /* not about the context: the engine's message stands */
    if (max_ctx > o->ctx)
        return err_set(e, WELD_ERR_LIMIT, "the prompt is %d tokens, longer than the context "
                       "(--ctx %d): shorten it or raise --ctx (the model allows up to %d)", n,
                       o->ctx, max_ctx);
    return err_set(e, WELD_ERR_LIMIT, "the prompt is %d tokens, longer than the model's "
                   "context of %d: shorten it", n, o->ctx);
}

/* Queue the request, then (only once it is accepted) say the seed, echo the prompt and run
   it to completion. */
/* --grammar / --grammar-file / --json-schema / --json-schema-file: the GBNF constraining
   the output into *gbnf (NULL: none). */
static int gen_constraint(const struct gen_opts *o, char **gbnf, struct weld_err *e)
{
    *gbnf = NULL;
    const char *flag = NULL;
    const char *const given[][2] = {{"--grammar", o->grammar},
                                    {"--grammar-file", o->grammar_file},
                                    {"--json-schema", o->json_schema},
                                    {"--json-schema-file", o->json_schema_file}};
    int which = -1;
    for (int i = 0; i < 4; i++)
        if (given[i][1]) {
            if (flag)
                return err_set(e, WELD_ERR_INVALID_ARG,
                               "%s and %s both constrain the "
                               "output; give one",
                               flag, given[i][0]);
            flag = given[i][0], which = i;
        }
    if (which < 0)
        return WELD_OK;
    char *text = NULL;
    size_t len = 0;
    int rc;
    if (which % 2) {
        if ((rc = file_read_all(given[which][1], &text, &len, e)))
            return err_prefix(e, "%s", flag);
    } else {
        len = strlen(given[which][1]);
        if (!(text = wstrdup(given[which][1])))
            return err_set(e, WELD_ERR_NOMEM, "out of memory");
    }
    if (which < 2) {
        *gbnf = text;
        return WELD_OK;
    }
    rc = grammar_gbnf_from_json_schema(text, len, gbnf, e);
    wfree(text);
    return rc ? err_prefix(e, "%s", flag) : WELD_OK;
}

static int run(struct engine *eng, const struct request_params *rp, struct gen_state *g,
               struct weld_err *e)
{
    const struct gen_opts *o = g->o;
    struct request_callbacks cb = {.user = g, .on_delta = on_delta, .on_finish = on_finish};
    uint64_t id;
    int rc = engine_add_request(eng, rp, &cb, &id, e);
    if (rc == WELD_ERR_LIMIT)
        rc = prompt_limit_error(eng, rp, o, e);
    if (rc != WELD_OK)
        return rc;
    if (o->seed < 0 && rp->sampling.temperature > 0 && o->n_predict != 0)
        log_info("seed %llu", (unsigned long long)rp->sampling.seed);
    if (!o->no_echo) {
        echo(o->prompt);
        g->wrote = true;
    }
    while (rc == WELD_OK && engine_has_work(eng))
        rc = engine_step(eng, e);
    if (rc != WELD_OK)
        return rc;
    if (g->res.finish == REQUEST_FINISH_ERROR)
        return err_set(e, WELD_ERR_INTERNAL, "%s", g->res.error ? g->res.error : "failed");
    return WELD_OK;
}

/* End the text line on stdout (the output always ends with a newline). */
static void end_text(const struct gen_state *g)
{
    if (g->wrote)
        fputc('\n', stdout);
    fflush(stdout);
    log_stdout_open(false);
}

/* A clean stderr line when the context, not -n or an end token, ended the text. */
static void context_notice(const struct gen_opts *o, const struct request_result *r)
{
    if (o->n_predict == 0 || r->finish != REQUEST_FINISH_LENGTH ||
        (o->n_predict > 0 && r->n_generated_tokens >= o->n_predict))
        return;
    if (o->n_predict < 0)
        log_info("the context is full (%d tokens, --ctx): done", o->ctx);
    else
        log_warn("stopped after %d of %d tokens: the context is full (%d tokens, --ctx)",
                 r->n_generated_tokens, o->n_predict, o->ctx);
}

/* The closing speed line (stderr): prefill from arrival to the first token, then decode;
   -n 0: the prompt alone. */
static void print_speed(const struct request_result *r, bool prompt_only)
{
    double t_prefill = r->t_first_token, t_dec = r->t_total - r->t_first_token;
    int n_gen = r->n_generated_tokens;
    log_break_line();
    fprintf(stderr, "%s: prompt %d tokens in %.3f s (%.1f tok/s)", log_prefix(),
            r->n_prompt_tokens, t_prefill, t_prefill > 0 ? r->n_prompt_tokens / t_prefill : 0.0);
    if (!prompt_only)
        fprintf(stderr, "; generated %d tokens in %.3f s (%.1f tok/s)", n_gen, t_dec,
                n_gen > 1 && t_dec > 0 ? (n_gen - 1) / t_dec : 0.0);
    fputc('\n', stderr);
}

/* A sampler_params_check message in this command's flags ("sampler: top_p 3 must be ..."
   becomes "--top-p 3 must be ..."). */
static void sampler_error_flags(struct weld_err *e)
{
    static const char *const map[][2] = {
        {"temperature", "--temp"}, {"top_p", "--top-p"}, {"min_p", "--min-p"},
        {"top_k", "--top-k"}, {"repetition_penalty", "--repeat-penalty"},
        {"frequency_penalty", "--frequency-penalty"}, {"presence_penalty", "--presence-penalty"},
    };
    const char *m = !strncmp(e->msg, "sampler: ", 9) ? e->msg + 9 : e->msg;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        size_t n = strlen(map[i][0]);
        if (!strncmp(m, map[i][0], n) && m[n] == ' ') {
            char rest[sizeof e->msg];
            snprintf(rest, sizeof rest, "%s", m + n);
            snprintf(e->msg, sizeof e->msg, "%s%s", map[i][1], rest);
            return;
        }
    }
}

/* The prompt of -f FILE or of stdin ("-"), less one trailing newline; *buf owns it. */
static int read_prompt(const char *path, char **buf, struct weld_err *e)
{
    bool std = !strcmp(path, "-");
    const char *name = std ? "standard input" : path;
    const char *flag = std ? "" : "-f ";
    FILE *f = std ? stdin : fopen(path, "rb");
    if (!f)
        return err_set(e, WELD_ERR_IO, "%s%s: cannot open (%s)", flag, name, strerror(errno));
    size_t len = 0, cap = 4096;
    char *b = wmalloc(cap);
    int rc = b ? WELD_OK : err_set(e, WELD_ERR_NOMEM, "out of memory");
    while (rc == WELD_OK) {
        if (len + 1 >= cap) {
            char *nb = cap < GEN_MAX_PROMPT_BYTES ? wrealloc(b, cap * 2) : NULL;
            if (!nb) {
                rc = err_set(e, WELD_ERR_LIMIT, "%s%s: more than %u MiB; not a prompt", flag,
                             name, GEN_MAX_PROMPT_BYTES >> 20);
                break;
            }
            b = nb;
            cap *= 2;
        }
        size_t n = fread(b + len, 1, cap - 1 - len, f);
        len += n;
        if (n == 0)
            break;
    }
    if (rc == WELD_OK && ferror(f))
        rc = err_set(e, WELD_ERR_IO, "%s%s: read error (%s)", flag, name, strerror(errno));
    if (!std)
        fclose(f);
    if (rc == WELD_OK && memchr(b, 0, len))
        rc = err_set(e, WELD_ERR_FORMAT, "%s%s: contains a NUL byte; the prompt must be text",
                     flag, name);
    if (rc != WELD_OK) {
        wfree(b);
        return rc;
    }
    if (len && b[len - 1] == '\n')
        len--;
    if (len && b[len - 1] == '\r')
        len--;
    b[len] = 0;
    *buf = b;
    return WELD_OK;
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
    const struct cli_opt base[] = {
        {"model", 'm', OPT_STR, &o.model, "MODEL",
         "GGUF file or Hugging Face directory (required)"},
        {"prompt", 'p', OPT_STR, &o.prompt, "TEXT",
         "prompt text; '-': read it from standard input (default: stdin when it is not a terminal)"},
        {"file", 'f', OPT_STR, &o.file, "FILE",
         "read the prompt from FILE (one trailing newline dropped)"},
        {"n-predict", 'n', OPT_INT, &o.n_predict, "N",
         "tokens to generate; -1: until the end of the text or a full context; 0: only evaluate the prompt (default 128)"},
        {"temp", 0, OPT_FLOAT, &o.sp.temperature, "T", "temperature; 0 = greedy (default 0.8)"},
        {"top-k", 0, OPT_INT, &o.sp.top_k, "K",
         "keep the K most likely tokens; 0 = off (default 40)"},
        {"top-p", 0, OPT_FLOAT, &o.sp.top_p, "P", "nucleus sampling mass; 1 = off (default 0.95)"},
        {"min-p", 0, OPT_FLOAT, &o.sp.min_p, "P",
         "drop tokens below P x the top probability; 0 = off (default 0.05)"},
        {"repeat-penalty", 0, OPT_FLOAT, &o.sp.repetition_penalty, "R",
         "repetition penalty; 1 = off (default 1)"},
        {"frequency-penalty", 0, OPT_FLOAT, &o.sp.frequency_penalty, "F",
         "frequency penalty (default 0)"},
        {"presence-penalty", 0, OPT_FLOAT, &o.sp.presence_penalty, "P",
         "presence penalty (default 0)"},
        {"seed", 's', OPT_I64, &o.seed, "S",
         "random seed; the same seed gives the same output (default: random, printed)"},
        {"chat", 0, OPT_FLAG, &o.chat, NULL,
         "wrap the prompt in the model's chat template as a user turn"},
        {"system", 0, OPT_STR, &o.system, "TEXT", "system message for --chat"},
        {"chat-template", 0, OPT_STR, &o.chat_template, "FILE|NAME",
         "Jinja chat template file or a builtin (chatml, llama2, llama3, mistral, qwen, gemma) for --chat (implies it)"},
        {"interactive", 'i', OPT_FLAG, &o.interactive, NULL,
         "chat in the terminal: the same as `weld chat` (see weld chat --help)"},
        {"ctx", 'c', OPT_INT, &o.ctx, "N", "context length (default: the model's, at most 4096)"},
        {"threads", 't', OPT_INT, &o.threads, "N",
         "forward-pass threads (default: one per physical core, one for models of tiny steps)"},
        {"no-echo", 0, OPT_FLAG, &o.no_echo, NULL, "print only the continuation, not the prompt"},
        {"ignore-eos", 0, OPT_FLAG, &o.ignore_eos, NULL,
         "keep generating after end-of-generation tokens"},
        {"no-special", 0, OPT_FLAG, &o.no_special, NULL,
         "do not add BOS/special tokens to the prompt"},
        {"show-ids", 0, OPT_FLAG, &o.show_ids, NULL,
         "also print the generated token ids to stderr"},
        {"speculative-config", 0, OPT_STR, &o.spec_config, "JSON",
         "speculative decoding, as vLLM: '{\"method\": \"ngram\", \"num_speculative_tokens\": 4}', method \"mtp\" (DeepSeek's MTP layer) or '{\"model\": \"draft.gguf\"}' (same output, fewer steps)"},
        {"model-draft", 0, OPT_STR, &o.model_draft, "MODEL",
         "draft model for speculative decoding, greedy guesses checked by the model (same output)"},
        {"grammar", 0, OPT_STR, &o.grammar, "GBNF",
         "constrain the output to a GBNF grammar (llama.cpp's notation, start rule root)"},
        {"grammar-file", 0, OPT_STR, &o.grammar_file, "FILE", "--grammar from a file"},
        {"json-schema", 'j', OPT_STR, &o.json_schema, "SCHEMA",
         "constrain the output to JSON matching a JSON Schema, e.g. '{\"type\": \"object\"}'"},
        {"json-schema-file", 0, OPT_STR, &o.json_schema_file, "FILE", "--json-schema from a file"},
    };
    enum { N_BASE = sizeof base / sizeof base[0] };
    struct cli_opt opts[N_BASE + CLI_EXEC_N_OPTS];
    memcpy(opts, base, sizeof base);
    int n_opts = N_BASE + cli_exec_opts_table(&o.exec, opts + N_BASE);
    /* -i: the conversation of `weld chat` (cmd_chat.c), which takes its own options */
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "-i") || !strcmp(argv[i], "--interactive"))
            return cmd_chat(argc, argv);
    const char *pos[1];
    int n_pos;
    int prc = cli_parse(argc, argv, "generate -m MODEL (-p PROMPT | -f FILE | -p - | < FILE) [options]",
                        "Generate text from a prompt. The prompt and then the continuation go to stdout\n"
                        "as they stream (ending with a newline); logs and the speed line go to stderr.",
                        opts, n_opts, pos, 0, &n_pos);
    if (prc)
        return prc == 1 ? 0 : 2;
    if (!o.model) {
        fprintf(stderr, "weld generate: -m MODEL is required (see --help)\n");
        return 2;
    }
    bool implicit_stdin = false; /* no -p / -f: the prompt is whatever stdin holds */
    if (o.prompt && o.file) {
        fprintf(stderr, "weld generate: give the prompt once: -p TEXT or -f FILE, not both\n");
        return 2;
    }
    if (!o.prompt && !o.file) {
        if (isatty(STDIN_FILENO)) {
            fprintf(stderr, "weld generate: no prompt: give -p TEXT, -f FILE, or pipe it in "
                            "(-p - reads standard input)\n");
            return 2;
        }
        o.file = "-"; /* a pipe or a redirected file, as llama-cli reads it */
        implicit_stdin = true;
    } else if (o.prompt && !strcmp(o.prompt, "-")) {
        o.file = "-";
        o.prompt = NULL;
    }
    if (o.n_predict < -1) {
        fprintf(stderr, "weld generate: -n %d: expected a token count >= 0, or -1 (until the "
                        "end of the text or a full context)\n", o.n_predict);
        return 2;
    }
    if (o.ctx < 0 || o.threads < 0) {
        fprintf(stderr, "weld generate: --ctx and --threads must not be negative\n");
        return 2;
    }
    if (o.seed < 0)
        o.sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20); /* said once accepted */
    else
        o.sp.seed = (uint64_t)o.seed;

    struct weld_err e;
    err_clear(&e);
    struct model *m = NULL;
    struct engine *eng = NULL;
    json_t *msgs = NULL;
    char *file_prompt = NULL;
    char *tmpl = NULL;
    int rc = sampler_params_check(&o.sp, &e);
    if (rc != WELD_OK)
        sampler_error_flags(&e);
    if (rc == WELD_OK && o.chat_template) {
        o.chat = true;
        if ((rc = chat_template_load(o.chat_template, &tmpl, &e)))
            err_prefix(&e, "--chat-template");
    }
    if (rc == WELD_OK && o.file && (rc = read_prompt(o.file, &file_prompt, &e)) == WELD_OK)
        o.prompt = file_prompt;
    char *gbnf = NULL;
    if (rc == WELD_OK)
        rc = gen_constraint(&o, &gbnf, &e);
    if (rc == WELD_OK && implicit_stdin && !*o.prompt)
        rc = err_set(&e, WELD_ERR_INVALID_ARG, "no prompt: standard input is empty; give "
                     "-p TEXT or -f FILE (-p \"\" for an empty prompt)");
    struct exec_tuning tuning;
    if (rc == WELD_OK)
        rc = cli_exec_tuning(&o.exec, &tuning, &e);
    if (rc == WELD_OK)
        rc = model_load(&m, o.model, &e);
    if (rc == WELD_OK) {
        int max_ctx = m->cfg.max_ctx;
        if (o.ctx == 0)
            o.ctx = max_ctx > 0 && max_ctx < 4096 ? max_ctx : 4096;
        else if (max_ctx > 0 && o.ctx > max_ctx)
            rc = err_set(&e, WELD_ERR_INVALID_ARG, "--ctx %d: longer than the model's context "
                         "of %d tokens; use --ctx %d or less", o.ctx, max_ctx, max_ctx);
    }
    if (rc == WELD_OK) {
        struct engine_params ep = engine_params_default();
        ep.model = m;
        ep.max_num_seqs = 1;
        ep.max_model_len = o.ctx;
        ep.quiet = true;
        ep.n_threads = o.threads;
        ep.tuning = tuning;
        rc = cli_spec_params(o.spec_config, o.model_draft, &ep, &e);
        if (rc == WELD_OK)
            rc = engine_create(&eng, &ep, &e);
    }
    if (rc == WELD_OK && o.chat && !tmpl && !tokenizer_chat_template(engine_tokenizer(eng)))
        rc = err_set(&e, WELD_ERR_NOT_FOUND,
                     "%s has no chat template: give one with --chat-template FILE or a builtin "
                     "name (%s)", o.model, chat_template_builtin_names());
    struct gen_state g = {.o = &o, .printing = o.n_predict != 0};
    if (rc == WELD_OK) {
        struct request_params rp = request_params_default();
        if (o.chat)
            rp.messages = msgs = chat_messages(&o);
        else
            rp.prompt = o.prompt;
        rp.chat_template = tmpl;
        rp.add_special_tokens = !o.no_special;
        rp.sampling = o.sp;
        rp.has_seed = true;
        /* -n 0: one token, discarded (the prompt's forward pass is the work); -n -1: the
           context ends it (a sequence never outgrows --ctx) */
        rp.max_tokens = o.n_predict > 0 ? o.n_predict : o.n_predict == 0 ? 1 : o.ctx;
        rp.ignore_eos = o.ignore_eos;
        rp.grammar = gbnf;
        rc = run(eng, &rp, &g, &e);
        end_text(&g);
        if (rc == WELD_OK) {
            if (o.show_ids && o.n_predict != 0)
                fputc('\n', stderr);
            context_notice(&o, &g.res);
            print_speed(&g.res, o.n_predict == 0);
            struct engine_stats st;
            engine_stats_get(eng, &st);
            if (st.spec_drafts > 0)
                fprintf(stderr,
                        "%s: speculative: %llu of %llu drafted tokens accepted (%.1f%%), "
                        "mean accepted length %.2f per verify step\n",
                        log_prefix(), (unsigned long long)st.spec_accepted_tokens,
                        (unsigned long long)st.spec_draft_tokens,
                        100.0 * (double)st.spec_accepted_tokens / (double)st.spec_draft_tokens,
                        (double)st.spec_accepted_tokens / (double)st.spec_drafts);
        }
    }
    if (rc != WELD_OK) {
        log_break_line();
        fprintf(stderr, "weld generate: %s\n", e.msg);
    }
    json_decref(msgs);
    wfree(tmpl);
    wfree(gbnf);
    engine_free(eng);
    model_free(m);
    wfree(file_prompt);
    return rc == WELD_OK ? 0 : 1;
}
