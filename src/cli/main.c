/*
 * main - `weld <command> [options]`: dispatch to the subcommands in cmd_*.c. The log
 * prefix becomes "weld <command>", so every message of a command, its own and the
 * library's, starts with that one prefix.
 */
#include "cli/cli.h"
#include "core/log.h"
#include "weld.h"

#include <stdio.h>
#include <string.h>

struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
};

static const struct command commands[] = {
    {"generate", cmd_generate, "generate text from a prompt"},
    {"chat", cmd_chat, "chat with a model in the terminal (its chat template, history kept)"},
    {"info", cmd_info, "show a model's architecture, tensors, tokenizer and memory needs"},
    {"tokenize", cmd_tokenize, "print the token ids of a text"},
    {"convert", cmd_convert, "convert between GGUF and Hugging Face directories, quantize"},
    {"mkmodel", cmd_mkmodel, "write a random-weight model at a real model's shape"},
    {"batch", cmd_batch, "run a JSONL file of requests through the engine (offline batch)"},
    {"serve", cmd_serve, "serve a model over HTTP with the OpenAI API"},
    {"router", cmd_router, "route OpenAI API requests across `weld serve` workers (a fleet)"},
    {"bench", cmd_bench, "benchmarks: bench throughput (continuous batching, prefix cache)"},
};

static void usage(FILE *f)
{
    fprintf(f, "weld %s - LLM inference engine\n\nusage: weld <command> [options]\n\ncommands:\n",
            weld_version());
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nRun 'weld <command> --help' for a command's options.\n\n"
               "The commands that run a model (generate, chat, batch, serve, bench) also take\n"
               "--exec mega|ops|ref (the executor), --accelerator NAME (the backend: cpu) and\n");
    cli_tune_help(f);
    fprintf(f, "'weld bench -m MODEL --pair A,B' compares two of them in one process, each side\n"
               "EXEC[:THREADS][@KEY=VALUE]..., e.g. --pair mega,ops or --pair mega,mega@repack=0.\n"
               "\nEnvironment (debugging):\n"
               "  WELD_LOG=error|warn|info|debug   log level (default info)\n"
               "  WELD_ISA=scalar|avx2|avx512|amx  force the CPU kernels' instruction set\n"
               "  WELD_TRACE=FILE                  Chrome trace of the mega executor's first steps\n"
               "  WELD_REGEX_MATCH_LIMIT=N         the tokenizer's regex match limit (PCRE2's)\n"
               "Flags, keys and when to change them: docs/TUNING.md.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("weld %s\n", weld_version());
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(cmd, commands[i].name)) {
            char prefix[32]; /* every message of the command starts "weld <cmd>: " */
            snprintf(prefix, sizeof prefix, "weld %s", commands[i].name);
            log_set_prefix(prefix);
            cli_tp_early(argc - 1, argv + 1); /* ranks other than 0 serve from here */
            return commands[i].fn(argc - 1, argv + 1);
        }
    fprintf(stderr, "weld: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
