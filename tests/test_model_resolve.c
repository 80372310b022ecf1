/*
 * test_model_resolve - model references: local paths win, `org/name[@rev]` resolves inside
 * a Hugging Face hub cache laid out as huggingface_hub writes it (refs/main holding the
 * commit, snapshots/<commit>/ of symlinks into blobs/), the cache directory follows
 * HF_HUB_CACHE, then HF_HOME, then XDG_CACHE_HOME, then HOME; misses say where weld looked.
 */
#include "test.h"

#include "model/resolve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[4096];

static void mkdirs(const char *fmt, const char *a)
{
    char p[4096], cmd[4200];
    snprintf(p, sizeof p, fmt, root, a);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", p);
    REQUIRE(system(cmd) == 0);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fputs(text, f);
    fclose(f);
}

static const char *P(const char *fmt, const char *a)
{
    static char buf[4][4096];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], fmt, root, a);
    return buf[k];
}

/* hub/models--org--name: blobs/b1 (config.json), snapshots/aaa (refs/main) and bbb (refs/v2),
   both linking config.json to the blob; models--org--gg: one snapshot with one .gguf and no
   refs; models--org--two: two .gguf files. */
static void make_cache(void)
{
    snprintf(root, sizeof root, "%s/cache", test_tmpdir());
    const char *repo = "%s/hub/models--org--name%s";
    mkdirs(repo, "/blobs");
    mkdirs(repo, "/refs");
    mkdirs(repo, "/snapshots/aaa");
    mkdirs(repo, "/snapshots/bbb");
    write_file(P(repo, "/blobs/b1"), "{}\n");
    write_file(P(repo, "/refs/main"), "aaa\n");
    write_file(P(repo, "/refs/v2"), "bbb");
    REQUIRE(symlink("../../blobs/b1", P(repo, "/snapshots/aaa/config.json")) == 0);
    REQUIRE(symlink("../../blobs/b1", P(repo, "/snapshots/bbb/config.json")) == 0);
    mkdirs("%s/hub/models--org--gg/snapshots/c0ffee%s", "");
    write_file(P("%s/hub/models--org--gg/snapshots/c0ffee/%s", "m.gguf"), "GGUF");
    write_file(P("%s/hub/models--org--gg/snapshots/c0ffee/%s", "README.md"), "x");
    mkdirs("%s/hub/models--org--two/snapshots/s1%s", "");
    write_file(P("%s/hub/models--org--two/snapshots/s1/%s", "a.gguf"), "GGUF");
    write_file(P("%s/hub/models--org--two/snapshots/s1/%s", "b.gguf"), "GGUF");
    mkdirs("%s/hub/models--org--broken/refs%s", "");
    write_file(P("%s/hub/models--org--broken/refs/%s", "main"), "deadbeef\n");
}

static int resolve(const char *ref, char *out, struct weld_err *e)
{
    err_clear(e);
    return model_resolve_path(ref, out, 4096, e);
}

TEST(hub_layout)
{
    char out[4096];
    struct weld_err e = {0};
    setenv("HF_HUB_CACHE", P("%s/hub%s", ""), 1);
    CHECK_EQ_INT(resolve("org/name", out, &e), WELD_OK);
    CHECK_EQ_STR(out, P("%s/hub/models--org--name/snapshots/aaa%s", ""));
    CHECK_EQ_INT(resolve("org/name@v2", out, &e), WELD_OK); /* a ref other than main */
    CHECK_EQ_STR(out, P("%s/hub/models--org--name/snapshots/bbb%s", ""));
    CHECK_EQ_INT(resolve("org/name@bbb", out, &e), WELD_OK); /* a commit directory */
    CHECK_EQ_STR(out, P("%s/hub/models--org--name/snapshots/bbb%s", ""));
    CHECK_EQ_INT(resolve("org/gg", out, &e), WELD_OK); /* no refs, one snapshot, one gguf */
    CHECK_EQ_STR(out, P("%s/hub/models--org--gg/snapshots/c0ffee/m.gguf%s", ""));
    CHECK_EQ_INT(resolve("org/two", out, &e), WELD_ERR_NOT_FOUND);
    CHECK(strstr(e.msg, "several .gguf files") != NULL);
    CHECK_EQ_INT(resolve("org/broken", out, &e), WELD_ERR_NOT_FOUND);
    CHECK(strstr(e.msg, "deadbeef") && strstr(e.msg, "missing"));
    CHECK_EQ_INT(resolve("org/name@nope", out, &e), WELD_ERR_NOT_FOUND);
    CHECK(strstr(e.msg, "revision 'nope'") != NULL);
}

TEST(misses_say_where)
{
    char out[4096];
    struct weld_err e = {0};
    setenv("HF_HUB_CACHE", P("%s/hub%s", ""), 1);
    CHECK_EQ_INT(resolve("org/absent", out, &e), WELD_ERR_NOT_FOUND);
    CHECK(strstr(e.msg, "org/absent") != NULL);
    CHECK(strstr(e.msg, P("%s/hub/models--org--absent%s", "")) != NULL);
    CHECK(strstr(e.msg, "$HF_HUB_CACHE") != NULL);
    CHECK(strstr(e.msg, "download") != NULL);
    /* not repo ids: plain "no such file", nothing looked up */
    static const char *paths[] = {"/no/such/model.gguf", "../x/y", "a/b/c", "org/..", "-x/y",
                                  "org/na me", "org/name@", "./model"};
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
        CHECK_EQ_INT(resolve(paths[i], out, &e), WELD_ERR_NOT_FOUND);
        CHECK(strstr(e.msg, "no such file or directory") != NULL);
        CHECK(strstr(e.msg, "cache") == NULL);
    }
}

TEST(env_order)
{
    char out[4096];
    struct weld_err e = {0};
    unsetenv("HF_HUB_CACHE");
    setenv("HF_HOME", root, 1); /* root/hub */
    CHECK_EQ_INT(resolve("org/name", out, &e), WELD_OK);
    CHECK_EQ_STR(out, P("%s/hub/models--org--name/snapshots/aaa%s", ""));
    unsetenv("HF_HOME");
    mkdirs("%s/xdg%s", "");
    REQUIRE(symlink(root, P("%s/xdg/%s", "huggingface")) == 0);
    setenv("XDG_CACHE_HOME", P("%s/xdg%s", ""), 1);
    CHECK_EQ_INT(resolve("org/name", out, &e), WELD_OK);
    CHECK(strstr(out, "/xdg/huggingface/hub/models--org--name/snapshots/aaa") != NULL);
    unsetenv("XDG_CACHE_HOME");
    mkdirs("%s/home/.cache%s", "");
    REQUIRE(symlink(root, P("%s/home/.cache/%s", "huggingface")) == 0);
    setenv("HOME", P("%s/home%s", ""), 1);
    CHECK_EQ_INT(resolve("org/name", out, &e), WELD_OK);
    CHECK(strstr(out, "/home/.cache/huggingface/hub/models--org--name") != NULL);
    CHECK_EQ_INT(resolve("org/absent", out, &e), WELD_ERR_NOT_FOUND);
    CHECK(strstr(e.msg, "~/.cache/huggingface/hub") != NULL);
}

TEST(local_path_wins)
{
    char out[4096];
    struct weld_err e = {0};
    setenv("HF_HUB_CACHE", P("%s/hub%s", ""), 1);
    /* a directory named org/name in the working directory beats the cache */
    REQUIRE(chdir(test_tmpdir()) == 0);
    mkdirs("%s/../org/name%s", "");
    CHECK_EQ_INT(resolve("org/name", out, &e), WELD_OK);
    CHECK_EQ_STR(out, "org/name");
    const char *abs = P("%s/hub/models--org--gg/snapshots/c0ffee/m.gguf%s", "");
    CHECK_EQ_INT(resolve(abs, out, &e), WELD_OK);
    CHECK_EQ_STR(out, abs);
    char small[8];
    CHECK_EQ_INT(model_resolve_path(abs, small, sizeof small, &e), WELD_ERR_LIMIT);
}

int main(void)
{
    make_cache();
    RUN(hub_layout);
    RUN(misses_say_where);
    RUN(env_order);
    RUN(local_path_wins);
    return test_summary();
}
