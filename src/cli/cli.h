/*
 * cli - the `weld` command: one file per subcommand (cmd_<name>.c), a dispatch table in
 * main.c, and a small table-driven option parser shared by all of them so every
 * subcommand has the same --help layout and error style.
 *
 * Subcommands return a process exit status: 0 success, 1 failure (an error was printed to
 * stderr naming what is wrong and what to do), 2 bad usage.
 */
#ifndef WELD_CLI_H
#define WELD_CLI_H

#include "core/err.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

enum cli_opt_type { OPT_FLAG, OPT_INT, OPT_I64, OPT_U64, OPT_FLOAT, OPT_STR, OPT_SIZE,
                    OPT_STRS };

/* OPT_STRS: an option that may be repeated; each value is kept (argv's storage). */
#define CLI_STRS_MAX 16
struct cli_strs {
    const char *v[CLI_STRS_MAX];
    int n;
};

struct cli_opt {
    const char *name;      /* long name without dashes, e.g. "top-k" */
    char short_name;       /* 0 if none */
    enum cli_opt_type type;
    void *dst;             /* bool* / int* / int64_t* / uint64_t* / float* / const char** /
                              uint64_t* (SIZE accepts 512M, 4G, 1.5GiB) / struct cli_strs* */
    const char *metavar;   /* e.g. "N"; NULL for flags */
    const char *help;      /* one line; mention the default */
};

/*
 * Parse argv[1..] (argv[0] is the subcommand name). Options may appear anywhere; "--"
 * ends them; llama.cpp's several-letter single-dash names (-md) stand for their long
 * options (args.c's alias table); "--name=value" and "--name value" both work. Positional arguments are
 * collected into pos (at most max_pos; *n_pos gets the count). -h/--help prints
 * "usage: weld <usage>", the description and the option table to stdout.
 * Returns 0 to go on, 1 if help was printed (exit 0), 2 on a usage error (printed).
 */
int cli_parse(int argc, char **argv, const char *usage, const char *description,
              const struct cli_opt *opts, int n_opts, const char **pos, int max_pos,
              int *n_pos);

/* Parse "123", "512M", "4G", "1.5GiB" into bytes; 0 on success. */
int cli_parse_size(const char *s, uint64_t *out);

/* vLLM's --structured-outputs-config JSON ({"backend", "disable_any_whitespace",
   "disable_additional_properties", "disable_fallback"}) into *o; an unknown key or a value
   of the wrong type is an error naming it. */
struct schema_opts;
int cli_structured_outputs_config(const char *json, struct schema_opts *o, struct weld_err *e);

/* The executor option group of every command that runs a model (tuning.c): --exec NAME,
   --tune KEY=VALUE (repeatable), --accelerator NAME. Zero-initialise it. */
struct exec_tuning;
struct tp_group;
struct cli_exec_opts {
    const char *exec, *accelerator;
    struct cli_strs tune;
    int k_parts;        /* --k-parts N (0: --tune's or none) */
    int tp_size;        /* --tensor-parallel-size N (0: one process) */
    int pp_size;        /* --pipeline-parallel-size N (0: one stage) */
    bool ep;            /* --enable-expert-parallel */
    float comm_timeout; /* --comm-timeout SECONDS (0: comm's default) */
};
#define CLI_EXEC_N_OPTS 8
/* Writes CLI_EXEC_N_OPTS entries to t; returns that count. */
int cli_exec_opts_table(struct cli_exec_opts *o, struct cli_opt *t);
/* The tuning the options ask for (names checked; errors name the flag). Under mpirun, or
   with --tensor-parallel-size N, it also starts the job's ranks (cli/tp.c): rank 0 returns
   with t->tp set; every other rank serves rank 0's forward steps and exits the process
   when rank 0 is done, never returning here. */
int cli_exec_tuning(const struct cli_exec_opts *o, struct exec_tuning *t, struct weld_err *e);
/* Several processes (cli/tp.c): start the group of tp_size x pp_size ranks (tensor x
   pipeline parallel), or none in a plain process; ranks other than 0 serve and exit. */
int cli_tp_start(int tp_size, int pp_size, bool ep, double timeout_s, struct tp_group **out,
                 struct weld_err *e);
/* Under mpirun, before a command reads anything (a prompt or requests on standard input
   reach rank 0 only): the group's flags taken from argv (--tensor-parallel-size / -tp,
   --pipeline-parallel-size / -pp, --enable-expert-parallel, --comm-timeout) and the
   group started, so every other rank serves from here and never runs the command. A
   plain process, or a command line without those flags: nothing. */
void cli_tp_early(int argc, char **argv);
/* Apply one KEY=VALUE setting (--tune, a `bench --pair` side's @KEY=VALUE); an unknown key
   or bad value is an error listing the keys or the values. */
int cli_tune_set(struct exec_tuning *t, const char *kv, struct weld_err *e);
/* The keys, their values and defaults (for `weld --help`). */
void cli_tune_help(FILE *f);

/* Engine options shared by `weld batch` and `weld bench throughput` (cmd_batch.c). */
struct cli_engine_opts {
    const char *model;
    int max_num_seqs, max_num_batched_tokens, max_model_len, block_size;
    int threads;           /* -t/--threads: forward-pass workers; 0: one per physical core */
    uint64_t kv_cache_memory;
    const char *kv_dtype, *policy;
    bool no_prefix_caching;
    bool no_jump_forward;    /* --disable-jump-forward */
    const char *spec_config; /* --speculative-config JSON (vLLM's) */
    const char *model_draft; /* --model-draft: a draft model (llama.cpp's -md) */
    const char *kv_offload_dir; /* --kv-offload-dir: the KV tier's file tier */
    uint64_t kv_offload_size;   /* --kv-offload-size */
    const char *kv_store;       /* --kv-store: its shared store (Redis URL) */
    struct cli_exec_opts exec;
};
#define CLI_ENGINE_N_OPTS (16 + CLI_EXEC_N_OPTS)
struct engine;
struct engine_params;
/* --speculative-config JSON and --model-draft into p->spec (NULL, NULL: off). */
int cli_spec_params(const char *json, const char *model_draft, struct engine_params *p,
                    struct weld_err *e);
void cli_engine_opts_init(struct cli_engine_opts *o);
/* Writes CLI_ENGINE_N_OPTS entries to t; returns that count. */
int cli_engine_opts_table(struct cli_engine_opts *o, struct cli_opt *t);
/* The engine params the options ask for (model_path set; the caller may lend a model). */
int cli_engine_params(const struct cli_engine_opts *o, struct engine_params *p,
                      struct weld_err *e);
int cli_engine_open(const struct cli_engine_opts *o, struct engine **eng, struct weld_err *e);
/* The closing summary on stderr: requests, tokens, hit rate, tokens/s, preemptions. */
void cli_engine_summary(const struct engine *eng, double seconds, const char *what);

int cmd_generate(int argc, char **argv);
/* `weld chat MODEL`, also `weld generate -i` (argv[0] is then "generate"). */
int cmd_chat(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_mkmodel(int argc, char **argv);
int cmd_batch(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_router(int argc, char **argv);
/* `weld bench -m MODEL` / `weld bench --bandwidth` (bench_model.c); argv[0] is "bench". */
int cmd_bench_model(int argc, char **argv);
/* `weld bench serve`: load generator for OpenAI-compatible servers (bench_serve.c). */
int cmd_bench_serve(int argc, char **argv);
/* `weld bench masks`: constrained decoding's token-mask time (bench_masks.c). */
int cmd_bench_masks(int argc, char **argv);

#endif
