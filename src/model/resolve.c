/*
 * resolve - model references: local paths, or Hugging Face hub cache entries (resolve.h).
 *
 * Only the file system is read: refs/<rev> (one line, the commit hash), snapshots/<commit>/
 * and the snapshot's entries. Components that reach the file system are checked against
 * the repo-id alphabet first, so a reference can never climb out of the cache ("..",
 * absolute paths, extra slashes are not repo ids and fall through to "no such file").
 */
#include "model/resolve.h"

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static bool id_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == '-';
}

/* One path component of a repo id or revision: [A-Za-z0-9._-]+, not starting with '.' or
   '-', no "..", at most 96 characters (the Hub's limit). */
static bool id_part(const char *s, size_t n)
{
    if (n == 0 || n > 96 || s[0] == '.' || s[0] == '-')
        return false;
    for (size_t i = 0; i < n; i++)
        if (!id_char(s[i]) || (i + 1 < n && s[i] == '.' && s[i + 1] == '.'))
            return false;
    return true;
}

/* The hub cache directory and the variable it came from. */
static void hub_dir(char *out, size_t cap, const char **from)
{
    const char *v;
    if ((v = getenv("HF_HUB_CACHE")) && *v) {
        snprintf(out, cap, "%s", v);
        *from = "$HF_HUB_CACHE";
    } else if ((v = getenv("HF_HOME")) && *v) {
        snprintf(out, cap, "%s/hub", v);
        *from = "$HF_HOME/hub";
    } else if ((v = getenv("XDG_CACHE_HOME")) && *v) {
        snprintf(out, cap, "%s/huggingface/hub", v);
        *from = "$XDG_CACHE_HOME/huggingface/hub";
    } else {
        v = getenv("HOME");
        snprintf(out, cap, "%s/.cache/huggingface/hub", v && *v ? v : "");
        *from = "the default ~/.cache/huggingface/hub";
    }
}

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* First line of refs/<rev> into out (a commit hash: checked like an id part). */
static bool read_ref(const char *repo, const char *rev, char *out, size_t cap)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/refs/%s", repo, rev);
    FILE *f = fopen(p, "r");
    if (!f)
        return false;
    bool ok = fgets(out, (int)cap, f) != NULL;
    fclose(f);
    if (!ok)
        return false;
    out[strcspn(out, "\r\n \t")] = 0;
    return id_part(out, strlen(out));
}

/* The only subdirectory of dir, if there is exactly one. */
static bool only_subdir(const char *dir, char *out, size_t cap)
{
    DIR *d = opendir(dir);
    if (!d)
        return false;
    int n = 0;
    struct dirent *de;
    char p[4096];
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (is_dir(p) && n++ == 0)
            snprintf(out, cap, "%s", de->d_name);
    }
    closedir(d);
    return n == 1;
}

/* A snapshot without config.json: its only *.gguf file. Returns how many there are. */
static int only_gguf(const char *dir, char *name, size_t cap)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l > 5 && !strcmp(de->d_name + l - 5, ".gguf") && n++ == 0)
            snprintf(name, cap, "%s", de->d_name);
    }
    closedir(d);
    return n;
}

static int put(char *out, size_t cap, const char *s, struct weld_err *e)
{
    if (strlen(s) >= cap)
        return err_set(e, WELD_ERR_LIMIT, "%s: path too long", s);
    memcpy(out, s, strlen(s) + 1);
    return WELD_OK;
}

int model_resolve_path(const char *ref, char *out, size_t cap, struct weld_err *e)
{
    struct stat st;
    if (stat(ref, &st) == 0)
        return put(out, cap, ref, e);
    /* org/name[@rev] or name[@rev] */
    const char *at = strchr(ref, '@'), *end = at ? at : ref + strlen(ref);
    const char *slash = memchr(ref, '/', (size_t)(end - ref));
    bool id = slash ? id_part(ref, (size_t)(slash - ref)) &&
                          id_part(slash + 1, (size_t)(end - slash - 1))
                    : id_part(ref, (size_t)(end - ref));
    if (id && at)
        id = id_part(at + 1, strlen(at + 1));
    if (!id)
        return err_set(e, WELD_ERR_NOT_FOUND, "%s: no such file or directory", ref);
    char hub[2048], repo[3072], rev[128], commit[128], snap[4096];
    const char *from;
    hub_dir(hub, sizeof hub, &from);
    int n = snprintf(repo, sizeof repo, "%s/models--", hub);
    for (const char *s = ref; s < end && n < (int)sizeof repo - 3; s++)
        n += s == slash ? snprintf(repo + n, sizeof repo - (size_t)n, "--")
                        : snprintf(repo + n, sizeof repo - (size_t)n, "%c", *s);
    snprintf(rev, sizeof rev, "%s", at ? at + 1 : "main");
    const char *todo = "download it first (`huggingface-cli download %.*s` or `hf download "
                       "%.*s`; weld never downloads), set HF_HUB_CACHE or HF_HOME if the "
                       "cache is elsewhere, or give the model's local path";
    char what[512];
    snprintf(what, sizeof what, todo, (int)(end - ref), ref, (int)(end - ref), ref);
    if (!is_dir(repo))
        return err_set(e, WELD_ERR_NOT_FOUND, "%s: not a local file or directory, and not in "
                       "the Hugging Face cache: looked for %s (%s); %s", ref, repo, from, what);
    char snaps[3200];
    snprintf(snaps, sizeof snaps, "%s/snapshots", repo);
    bool found = read_ref(repo, rev, commit, sizeof commit);
    if (!found && at) { /* a commit hash given directly */
        snprintf(commit, sizeof commit, "%s", rev);
        snprintf(snap, sizeof snap, "%s/%s", snaps, commit);
        found = is_dir(snap);
    }
    if (!found && !at)
        found = only_subdir(snaps, commit, sizeof commit);
    if (!found)
        return err_set(e, WELD_ERR_NOT_FOUND, "%s: in the Hugging Face cache (%s) but revision "
                       "'%s' is not: looked for %s/refs/%s%s%s; %s", ref, repo, rev, repo, rev,
                       at ? " and " : "", at ? snap : "", what);
    snprintf(snap, sizeof snap, "%s/%s", snaps, commit);
    if (!is_dir(snap))
        return err_set(e, WELD_ERR_NOT_FOUND, "%s: refs/%s in %s names snapshot %s, which is "
                       "missing (an interrupted download?); %s", ref, rev, repo, commit, what);
    char p[4352], g[256];
    snprintf(p, sizeof p, "%s/config.json", snap);
    if (stat(p, &st) == 0)
        return put(out, cap, snap, e);
    int ng = only_gguf(snap, g, sizeof g);
    if (ng == 1) {
        snprintf(p, sizeof p, "%s/%s", snap, g);
        return put(out, cap, p, e);
    }
    return err_set(e, WELD_ERR_NOT_FOUND, "%s: the cached snapshot %s has no config.json and "
                   "%s; give the path of the model file or directory inside it", ref, snap,
                   ng ? "several .gguf files" : "no .gguf file");
}
