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

#include <stdbool.h>
#include <stdint.h>

enum cli_opt_type { OPT_FLAG, OPT_INT, OPT_I64, OPT_U64, OPT_FLOAT, OPT_STR, OPT_SIZE };

struct cli_opt {
    const char *name;      /* long name without dashes, e.g. "top-k" */
    char short_name;       /* 0 if none */
    enum cli_opt_type type;
    void *dst;             /* bool* / int* / int64_t* / uint64_t* / float* / const char** /
                              uint64_t* (SIZE accepts 512M, 4G, 1.5GiB) */
    const char *metavar;   /* e.g. "N"; NULL for flags */
    const char *help;      /* one line; mention the default */
};

/*
 * Parse argv[1..] (argv[0] is the subcommand name). Options may appear anywhere; "--"
 * ends them; "--name=value" and "--name value" both work. Positional arguments are
 * collected into pos (at most max_pos; *n_pos gets the count). -h/--help prints
 * "usage: weld <usage>", the description and the option table to stdout.
 * Returns 0 to go on, 1 if help was printed (exit 0), 2 on a usage error (printed).
 */
int cli_parse(int argc, char **argv, const char *usage, const char *description,
              const struct cli_opt *opts, int n_opts, const char **pos, int max_pos,
              int *n_pos);

/* Parse "123", "512M", "4G", "1.5GiB" into bytes; 0 on success. */
int cli_parse_size(const char *s, uint64_t *out);

int cmd_generate(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_mkmodel(int argc, char **argv);

#endif
