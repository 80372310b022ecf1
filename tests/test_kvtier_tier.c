/*
 * The KV tier (kvtier/): entries written and read back bit for bit through the file tier
 * and the Redis store, runs that stop at the first missing block, damaged, truncated and
 * foreign entries refused and deleted, the file tier's byte budget (least recently used
 * out first, the order kept across a restart), a store that goes away and comes back.
 * The Redis cases start their own redis-server on a Unix socket in a temporary directory
 * and are skipped where there is none.
 */
#include "test.h"

#include "kvtier/kvtier.h"

#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/wait.h>

#define BB 1000

static const uint8_t FP[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
static const uint8_t FP2[16] = {9, 9, 9};

static char tmp_root[256];

static const char *tmpdir(const char *name)
{
    static char buf[512];
    if (!tmp_root[0]) {
        snprintf(tmp_root, sizeof tmp_root, "/tmp/weld_kvtier_%ld", (long)getpid());
        mkdir(tmp_root, 0755);
    }
    snprintf(buf, sizeof buf, "%s/%s", tmp_root, name);
    return buf;
}

static int rm_cb(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    (void)st, (void)flag, (void)f;
    return remove(p);
}

static void fill(uint8_t *b, int seed)
{
    for (int i = 0; i < BB; i++)
        b[i] = (uint8_t)(seed * 31 + i * 7);
}

static struct kvtier_key K(int i) {
    return (struct kvtier_key){(uint64_t)i * 77 + 5, (uint64_t)i};
}

static struct kvtier *
open_file(const char *dir, uint64_t budget, const uint8_t *fp)
{
    struct kvtier_config c = {.dir = dir, .dir_max_bytes = budget, .block_bytes = BB};
    memcpy(c.fingerprint, fp, 16);
    struct kvtier *t = NULL;
    struct weld_err e = {0};
    if (kvtier_open(&t, &c, &e))
        fprintf(stderr, "kvtier_open: %s\n", e.msg);
    return t;
}

static void put_n(struct kvtier *t, int from, int n)
{
    for (int i = from; i < from + n; i++) {
        uint8_t b[BB];
        fill(b, i);
        struct kvtier_key k = K(i);
        CHECK(kvtier_put(t, &k, 1, b, true) == 1);
    }
    kvtier_flush(t);
}

/* True when block i reads back with the bytes it was written with. */
static bool reads(struct kvtier *t, int i)
{
    uint8_t got[BB], want[BB];
    fill(want, i);
    struct kvtier_key k = K(i);
    return kvtier_get_run(t, &k, 1, got) == 1 && !memcmp(got, want, BB);
}

static void entry_path(char *buf, size_t cap, const char *dir, const uint8_t *fp, int i)
{
    char name[128];
    kvtier_entry_name(name, sizeof name, fp, K(i));
    snprintf(buf, cap, "%s/%s", dir, name);
}

TEST(file_roundtrip_and_runs)
{
    const char *dir = tmpdir("rt");
    struct kvtier *t = open_file(dir, 0, FP);
    REQUIRE(t);
    put_n(t, 0, 5);
    struct kvtier_key keys[6] = {K(0), K(1), K(2), K(3), K(4), K(99)};
    uint8_t buf[6 * BB];
    CHECK_EQ_INT(kvtier_get_run(t, keys, 6, buf), 5);
    for (int i = 0; i < 5; i++) {
        uint8_t want[BB];
        fill(want, i);
        CHECK(!memcmp(buf + i * BB, want, BB));
    }
    keys[2] = K(98); /* a hole: the run stops before it */
    CHECK_EQ_INT(kvtier_get_run(t, keys, 6, buf), 2);
    /* written again: already there, not rewritten */
    put_n(t, 0, 1);
    struct kvtier_stats st;
    kvtier_stats_get(t, &st);
    CHECK(st.t[KVTIER_FILE].on && !st.t[KVTIER_STORE].on);
    CHECK_EQ_INT((int)st.t[KVTIER_FILE].puts, 5);
    CHECK_EQ_INT((int)st.t[KVTIER_FILE].present, 1);
    CHECK_EQ_INT((int)st.t[KVTIER_FILE].entries, 5);
    CHECK_EQ_INT((int)st.t[KVTIER_FILE].hits, 7);
    CHECK_EQ_INT((int)st.t[KVTIER_FILE].misses, 2);
    kvtier_close(t);
}

TEST(file_refuses_damaged_and_foreign_entries)
{
    const char *d = tmpdir("bad");
    char dir[512];
    snprintf(dir, sizeof dir, "%s", d);
    struct kvtier *t = open_file(dir, 0, FP);
    REQUIRE(t);
    put_n(t, 0, 4);
    char p[1024];
    /* 0: a payload byte flipped */
    entry_path(p, sizeof p, dir, FP, 0);
    FILE *f = fopen(p, "r+b");
    REQUIRE(f);
    fseek(f, KVTIER_HEADER_BYTES + 10, SEEK_SET);
    int c = fgetc(f);
    fseek(f, KVTIER_HEADER_BYTES + 10, SEEK_SET);
    fputc(c ^ 1, f);
    fclose(f);
    CHECK(!reads(t, 0));
    CHECK(access(p, F_OK) != 0); /* deleted */
    /* 1: truncated */
    entry_path(p, sizeof p, dir, FP, 1);
    CHECK(truncate(p, 500) == 0);
    CHECK(!reads(t, 1));
    /* 2: another model's entry under this model's name (its header says FP2) */
    struct kvtier *t2 = open_file(dir, 0, FP2);
    REQUIRE(t2);
    put_n(t2, 2, 1);
    char p2[1024];
    entry_path(p2, sizeof p2, dir, FP2, 2);
    entry_path(p, sizeof p, dir, FP, 2);
    CHECK(rename(p2, p) == 0);
    CHECK(!reads(t, 2));
    /* 3: a header for another key (entry 3's file holding entry 4's bytes) */
    char p4[1024];
    entry_path(p, sizeof p, dir, FP, 3);
    entry_path(p4, sizeof p4, dir, FP, 3 + 1);
    put_n(t, 4, 1);
    CHECK(rename(p4, p) == 0);
    CHECK(!reads(t, 3));
    struct kvtier_stats st;
    kvtier_stats_get(t, &st);
    CHECK_EQ_INT((int)st.t[KVTIER_FILE].rejects, 4);
    CHECK_EQ_INT((int)st.t[KVTIER_FILE].hits, 0);
    kvtier_close(t2);
    kvtier_close(t);
}

TEST(file_budget_lru_and_restart)
{
    const char *d = tmpdir("lru");
    char dir[512];
    snprintf(dir, sizeof dir, "%s", d);
    const uint64_t entry = KVTIER_HEADER_BYTES + BB, budget = 10 * entry;
    struct kvtier *t = open_file(dir, budget, FP);
    REQUIRE(t);
    put_n(t, 0, 30);
    struct kvtier_stats st;
    kvtier_stats_get(t, &st);
    CHECK_EQ_INT((int)st.t[KVTIER_FILE].entries, 10);
    CHECK(st.t[KVTIER_FILE].bytes <= budget);
    CHECK_EQ_INT((int)st.t[KVTIER_FILE].evictions, 20);
    for (int i = 0; i < 20; i++)
        CHECK(!reads(t, i));
    CHECK(reads(t, 20)); /* 20 becomes the most recently used */
    kvtier_close(t);
    /* a leftover temporary file of a writer that died */
    char fph[128], tmpf[1024];
    kvtier_entry_name(fph, sizeof fph, FP, K(0));
    *strchr(fph, '/') = 0;
    snprintf(tmpf, sizeof tmpf, "%s/%s/.tmp-1-x", dir, fph);
    FILE *f = fopen(tmpf, "wb");
    REQUIRE(f);
    fclose(f);
    /* restart: the index comes back from the directory, in mtime order */
    t = open_file(dir, budget, FP);
    REQUIRE(t);
    CHECK(access(tmpf, F_OK) != 0);
    kvtier_stats_get(t, &st);
    CHECK_EQ_INT((int)st.t[KVTIER_FILE].entries, 10);
    put_n(t, 100, 9); /* pushes out 9 of the 10: all but the most recently used, 20 */
    CHECK(reads(t, 20));
    for (int i = 21; i < 30; i++)
        CHECK(!reads(t, i));
    kvtier_close(t);
}

TEST(open_errors)
{
    struct kvtier *t = NULL;
    struct weld_err e = {0};
    struct kvtier_config c = {.block_bytes = BB};
    CHECK(kvtier_open(&t, &c, &e) != 0);
    c.dir = "/proc/weld-cannot-be-here";
    CHECK(kvtier_open(&t, &c, &e) != 0);
    CHECK(strstr(e.msg, "--kv-offload-dir") != NULL);
    c.dir = NULL;
    const char *bad[] = {"http://x", "redis://", "redis://h:99999", "redis://h/x", "unix://"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        c.store_url = bad[i];
        CHECK(kvtier_open(&t, &c, &e) == WELD_ERR_INVALID_ARG);
        CHECK(strstr(e.msg, "--kv-store") != NULL);
    }
    c.store_url = "redis://127.0.0.1:1";
    CHECK(kvtier_open(&t, &c, &e) == WELD_ERR_IO);
    CHECK(strstr(e.msg, "cannot connect") != NULL);
    CHECK(t == NULL);
}

/* ---- the Redis store ------------------------------------------------------------------- */

static pid_t redis_pid;
static char redis_sock[512], redis_url[600];

static bool redis_start(void)
{
    if (system("command -v redis-server >/dev/null 2>&1") != 0)
        return false;
    snprintf(redis_sock, sizeof redis_sock, "%s/redis.sock", tmpdir(""));
    snprintf(redis_url, sizeof redis_url, "unix://%s", redis_sock);
    unlink(redis_sock);
    fflush(NULL);
    redis_pid = fork();
    if (redis_pid == 0) {
        freopen("/dev/null", "w", stdout);
        execlp("redis-server", "redis-server", "--port", "0", "--unixsocket", redis_sock, "--save",
               "", "--appendonly", "no", "--loglevel", "warning", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 200; i++) {
        redisContext *c = redisConnectUnix(redis_sock);
        bool ok = c && !c->err;
        if (c)
            redisFree(c);
        if (ok)
            return true;
        usleep(20000);
    }
    return false;
}

static void redis_stop(void)
{
    if (redis_pid > 0) {
        kill(redis_pid, SIGTERM);
        waitpid(redis_pid, NULL, 0);
        redis_pid = 0;
    }
}

static struct kvtier *open_store(const char *dir)
{
    struct kvtier_config c = {.dir = dir, .store_url = redis_url, .block_bytes = BB};
    memcpy(c.fingerprint, FP, 16);
    struct kvtier *t = NULL;
    struct weld_err e = {0};
    if (kvtier_open(&t, &c, &e))
        fprintf(stderr, "kvtier_open: %s\n", e.msg);
    return t;
}

TEST(store_shared_damaged_and_gone)
{
    if (!redis_start())
        SKIP("no redis-server to start (apt-get install redis-server)");
    /* worker A writes (file + store), worker B (its own empty directory) reads the store */
    char da[512], db[512];
    snprintf(da, sizeof da, "%s", tmpdir("wa"));
    snprintf(db, sizeof db, "%s", tmpdir("wb"));
    struct kvtier *a = open_store(da), *b = open_store(db);
    REQUIRE(a && b);
    put_n(a, 0, 6);
    struct kvtier_key keys[7] = {K(0), K(1), K(2), K(3), K(4), K(5), K(6)};
    uint8_t buf[7 * BB];
    CHECK_EQ_INT(kvtier_get_run(b, keys, 7, buf), 6);
    for (int i = 0; i < 6; i++) {
        uint8_t want[BB];
        fill(want, i);
        CHECK(!memcmp(buf + i * BB, want, BB));
    }
    struct kvtier_stats st;
    kvtier_stats_get(b, &st);
    CHECK_EQ_INT((int)st.t[KVTIER_STORE].hits, 6);
    CHECK_EQ_INT((int)st.t[KVTIER_FILE].hits, 0);
    /* B saving the same blocks finds them in the store: only its file tier writes */
    put_n(b, 0, 6);
    kvtier_stats_get(b, &st);
    CHECK_EQ_INT((int)st.t[KVTIER_STORE].present, 6);
    CHECK_EQ_INT((int)st.t[KVTIER_FILE].puts, 6);
    /* a damaged value in the store is refused and deleted */
    redisContext *c = redisConnectUnix(redis_sock);
    REQUIRE(c && !c->err);
    char name[256], hex[128];
    kvtier_entry_name(hex, sizeof hex, FP, K(3));
    *strchr(hex, '.') = 0;
    *strchr(hex, '/') = ':';
    snprintf(name, sizeof name, "weld:kv:%s", hex);
    redisReply *y = redisCommand(c, "GET %s", name);
    REQUIRE(y && y->type == REDIS_REPLY_STRING && y->len == KVTIER_HEADER_BYTES + BB);
    char *v = malloc((size_t)y->len);
    memcpy(v, y->str, (size_t)y->len);
    v[KVTIER_HEADER_BYTES + 5] ^= 0x40;
    freeReplyObject(y);
    y = redisCommand(c, "SET %s %b", name, v, (size_t)(KVTIER_HEADER_BYTES + BB));
    freeReplyObject(y);
    free(v);
    struct kvtier *fresh = open_store(tmpdir("wc"));
    REQUIRE(fresh);
    CHECK_EQ_INT(kvtier_get_run(fresh, keys, 7, buf), 3);
    kvtier_stats_get(fresh, &st);
    CHECK_EQ_INT((int)st.t[KVTIER_STORE].rejects, 1);
    y = redisCommand(c, "EXISTS %s", name);
    CHECK(y && y->type == REDIS_REPLY_INTEGER && y->integer == 0);
    freeReplyObject(y);
    redisFree(c);
    /* the store goes away: reads miss, writes fail, nothing crashes; the file tier goes on */
    redis_stop();
    CHECK_EQ_INT(kvtier_get_run(fresh, keys, 7, buf), 0);
    CHECK_EQ_INT(kvtier_get_run(a, keys, 7, buf), 6); /* a's own files */
    uint8_t one[BB];
    fill(one, 50);
    struct kvtier_key k50 = K(50);
    CHECK(kvtier_put(fresh, &k50, 1, one, true) == 1);
    kvtier_flush(fresh);
    kvtier_stats_get(fresh, &st);
    CHECK(st.t[KVTIER_STORE].errors >= 1);
    /* and comes back (empty): the connection is made again */
    REQUIRE(redis_start());
    usleep(1100 * 1000);
    put_n(fresh, 60, 1);
    CHECK(reads(b, 60)); /* b's store connection came back too */
    kvtier_close(fresh);
    kvtier_close(a);
    kvtier_close(b);
    redis_stop();
}

int main(void)
{
    RUN(file_roundtrip_and_runs);
    RUN(file_refuses_damaged_and_foreign_entries);
    RUN(file_budget_lru_and_restart);
    RUN(open_errors);
    RUN(store_shared_damaged_and_gone);
    redis_stop();
    if (!getenv("KEEP"))
        nftw(tmp_root, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    return test_summary();
}
