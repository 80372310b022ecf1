/*
 * tier_file - the file tier: one file per entry under DIR/<fingerprint hex>/<key hex>.kvb.
 *
 * Index. Every entry file of the directory (all fingerprints: the budget is the
 * directory's) has a node in a chained hash map on (fingerprint, key) and on one LRU list
 * (head = least recently used). At open the directory is scanned and the list ordered by
 * file mtime; a write or a read that hits sets the file's mtime to now, made strictly
 * increasing within the process (stamp), so the order survives a restart. Leftover temporary files (a writer killed mid-write) are deleted.
 *
 * Writes go to DIR/<fp>/.tmp-<pid>-<key> and are renamed into place, so a reader never sees
 * half an entry (a crash can still leave a torn file after a power loss: checksums catch
 * it). After a write the least recently used entries are unlinked until the directory is
 * back under its budget. Several processes may share a directory: each indexes what it
 * saw and reads files it has not seen; an unlink of a file already gone is harmless.
 *
 * Locking: mu guards the index; file I/O runs outside it.
 */
#include "core/alloc.h"
#include "kvtier/tier.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

struct fnode {
    uint8_t id[32]; /* fingerprint, key bytes */
    uint64_t bytes;
    int64_t mtime_ns;   /* at the scan (ordering only) */
    int32_t prev, next; /* LRU, -1 at the ends */
    int32_t chain;      /* bucket chain, -1 at the end; free list link when unused */
    bool used;
};

struct tfile {
    char *dir;
    uint8_t fp[16];
    size_t entry_bytes;
    uint64_t max_bytes;
    pthread_mutex_t mu;
    struct fnode *v;
    int32_t n, cap, free_head;
    int32_t *buckets;
    uint32_t mask;
    int32_t lru_head, lru_tail;
    uint64_t bytes, entries, evictions;
    int64_t last_stamp; /* ns of the last mtime set (stamp) */
};

static uint32_t id_hash(const struct tfile *f, const uint8_t id[32])
{
    return (uint32_t)XXH3_64bits(id, 32) & f->mask;
}

static int32_t find(const struct tfile *f, const uint8_t id[32])
{
    for (int32_t i = f->buckets[id_hash(f, id)]; i >= 0; i = f->v[i].chain)
        if (!memcmp(f->v[i].id, id, 32))
            return i;
    return -1;
}

static void lru_unlink(struct tfile *f, int32_t i)
{
    struct fnode *x = &f->v[i];
    if (x->prev >= 0)
        f->v[x->prev].next = x->next;
    else
        f->lru_head = x->next;
    if (x->next >= 0)
        f->v[x->next].prev = x->prev;
    else
        f->lru_tail = x->prev;
    x->prev = x->next = -1;
}

static void lru_push_tail(struct tfile *f, int32_t i)
{
    struct fnode *x = &f->v[i];
    x->prev = f->lru_tail;
    x->next = -1;
    if (f->lru_tail >= 0)
        f->v[f->lru_tail].next = i;
    else
        f->lru_head = i;
    f->lru_tail = i;
}

static int rehash(struct tfile *f, uint32_t nb)
{
    int32_t *b = wmalloc((size_t)nb * sizeof *b);
    if (!b)
        return -1;
    memset(b, 0xff, (size_t)nb * sizeof *b);
    wfree(f->buckets);
    f->buckets = b;
    f->mask = nb - 1;
    for (int32_t i = 0; i < f->n; i++)
        if (f->v[i].used) {
            uint32_t h = id_hash(f, f->v[i].id);
            f->v[i].chain = b[h];
            b[h] = i;
        }
    return 0;
}

/* Add a node (not yet there) at the LRU tail; -1 on out of memory. */
static int32_t add(struct tfile *f, const uint8_t id[32], uint64_t bytes, int64_t mtime_ns)
{
    int32_t i;
    if (f->free_head >= 0) {
        i = f->free_head;
        f->free_head = f->v[i].chain;
    } else {
        if (f->n == f->cap) {
            int32_t cap = f->cap ? f->cap * 2 : 1024;
            struct fnode *v = wrealloc(f->v, (size_t)cap * sizeof *v);
            if (!v)
                return -1;
            f->v = v;
            f->cap = cap;
        }
        i = f->n++;
        if ((uint32_t)f->n > (f->mask + 1) / 2 && rehash(f, (f->mask + 1) * 2)) {
            f->n--;
            return -1;
        }
    }
    struct fnode *x = &f->v[i];
    memcpy(x->id, id, 32);
    x->bytes = bytes;
    x->mtime_ns = mtime_ns;
    x->used = true;
    uint32_t h = id_hash(f, id);
    x->chain = f->buckets[h];
    f->buckets[h] = i;
    lru_push_tail(f, i);
    f->bytes += bytes;
    f->entries++;
    return i;
}

static void remove_node(struct tfile *f, int32_t i)
{
    struct fnode *x = &f->v[i];
    int32_t *link = &f->buckets[id_hash(f, x->id)];
    while (*link != i)
        link = &f->v[*link].chain;
    *link = x->chain;
    lru_unlink(f, i);
    f->bytes -= x->bytes;
    f->entries--;
    x->used = false;
    x->chain = f->free_head;
    f->free_head = i;
}

static void id_path(const struct tfile *f, const uint8_t id[32], char *buf, size_t cap)
{
    char a[33], b[33];
    tier_hex16(a, id);
    tier_hex16(b, id + 16);
    snprintf(buf, cap, "%s/%s/%s.kvb", f->dir, a, b);
}

static void make_id(uint8_t id[32], const uint8_t fp[16], struct kvtier_key k)
{
    memcpy(id, fp, 16);
    tier_key_bytes(id + 16, k);
}

static bool hex_to(uint8_t out[16], const char *s)
{
    for (int i = 0; i < 32; i++) {
        char c = s[i];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (v < 0)
            return false;
        if (i % 2 == 0)
            out[i / 2] = (uint8_t)(v << 4);
        else
            out[i / 2] |= (uint8_t)v;
    }
    return s[32] == 0 || s[32] == '.';
}

static int cmp_mtime(const void *a, const void *b)
{
    const struct fnode *x = a, *y = b;
    return (x->mtime_ns > y->mtime_ns) - (x->mtime_ns < y->mtime_ns);
}

/* Unlink LRU entries until under budget. Under mu. */
static void evict(struct tfile *f)
{
    while (f->bytes > f->max_bytes && f->lru_head >= 0) {
        int32_t i = f->lru_head;
        char path[4096];
        id_path(f, f->v[i].id, path, sizeof path);
        unlink(path);
        remove_node(f, i);
        f->evictions++;
    }
}

/* Read every entry file of the directory into a list ordered by mtime, then index it. */
static int scan(struct tfile *f)
{
    DIR *top = opendir(f->dir);
    if (!top)
        return -1;
    struct fnode *all = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(top))) {
        uint8_t fp[16];
        if (strlen(de->d_name) != 32 || !hex_to(fp, de->d_name))
            continue;
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/%s", f->dir, de->d_name);
        DIR *d = opendir(sub);
        if (!d)
            continue;
        struct dirent *fe;
        while ((fe = readdir(d))) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", sub, fe->d_name);
            if (!strncmp(fe->d_name, ".tmp-", 5)) {
                unlink(path);
                continue;
            }
            uint8_t key[16];
            struct stat st;
            if (strlen(fe->d_name) != 36 || strcmp(fe->d_name + 32, ".kvb") ||
                !hex_to(key, fe->d_name) || stat(path, &st) || !S_ISREG(st.st_mode))
                continue;
            if (n == cap) {
                cap = cap ? cap * 2 : 1024;
                struct fnode *v = wrealloc(all, cap * sizeof *v);
                if (!v) {
                    closedir(d);
                    closedir(top);
                    wfree(all);
                    return -1;
                }
                all = v;
            }
            memcpy(all[n].id, fp, 16);
            memcpy(all[n].id + 16, key, 16);
            all[n].bytes = (uint64_t)st.st_size;
            all[n].mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
            n++;
        }
        closedir(d);
    }
    closedir(top);
    if (n)
        qsort(all, n, sizeof *all, cmp_mtime);
    for (size_t i = 0; i < n; i++)
        if (find(f, all[i].id) < 0 && add(f, all[i].id, all[i].bytes, all[i].mtime_ns) < 0) {
            wfree(all);
            return -1;
        }
    wfree(all);
    evict(f);
    return 0;
}

/* Stamp fd's mtime with a strictly increasing time (file times are coarse: entries
   written in one clock tick would tie and lose their order across a restart). */
static void stamp(struct tfile *f, int fd)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    int64_t ns = (int64_t)now.tv_sec * 1000000000LL + now.tv_nsec;
    pthread_mutex_lock(&f->mu);
    if (ns <= f->last_stamp)
        ns = f->last_stamp + 1;
    f->last_stamp = ns;
    pthread_mutex_unlock(&f->mu);
    struct timespec ts[2] = {{0, UTIME_OMIT},
                             {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)}};
    (void)futimens(fd, ts);
}

static bool read_all(int fd, uint8_t *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        got += (size_t)r;
    }
    return true;
}

static int f_get_run(void *b, const struct kvtier_key *keys, int n, uint8_t *entries, int *bad,
                     bool *error)
{
    struct tfile *f = b;
    *bad = -1;
    for (int i = 0; i < n; i++) {
        uint8_t id[32];
        char path[4096];
        make_id(id, f->fp, keys[i]);
        id_path(f, id, path, sizeof path);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            if (errno != ENOENT)
                *error = true;
            pthread_mutex_lock(&f->mu);
            int32_t x = find(f, id);
            if (x >= 0)
                remove_node(f, x);
            pthread_mutex_unlock(&f->mu);
            return i;
        }
        struct stat st;
        bool ok = !fstat(fd, &st) && (uint64_t)st.st_size == f->entry_bytes;
        if (ok && !read_all(fd, entries + (size_t)i * f->entry_bytes, f->entry_bytes)) {
            ok = false;
            *error = true;
        }
        if (ok)
            stamp(f, fd);
        close(fd);
        if (!ok) {
            *bad = i;
            return i;
        }
        pthread_mutex_lock(&f->mu);
        int32_t x = find(f, id);
        if (x >= 0) {
            lru_unlink(f, x);
            lru_push_tail(f, x);
        } else {
            add(f, id, f->entry_bytes, 0);
            evict(f);
        }
        pthread_mutex_unlock(&f->mu);
    }
    return n;
}

static int f_put(void *b, struct kvtier_key key, const uint8_t *entry)
{
    struct tfile *f = b;
    uint8_t id[32];
    char path[4096], tmp[4200];
    make_id(id, f->fp, key);
    id_path(f, id, path, sizeof path);
    struct stat st;
    if (!stat(path, &st) && (uint64_t)st.st_size == f->entry_bytes)
        return 0;
    char fph[33], kh[33];
    tier_hex16(fph, f->fp);
    tier_hex16(kh, id + 16);
    snprintf(tmp, sizeof tmp, "%s/%s/.tmp-%ld-%s", f->dir, fph, (long)getpid(), kh);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    size_t done = 0;
    while (done < f->entry_bytes) {
        ssize_t w = write(fd, entry + done, f->entry_bytes - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        done += (size_t)w;
    }
    stamp(f, fd);
    if (close(fd) || done < f->entry_bytes || rename(tmp, path)) {
        unlink(tmp);
        return -1;
    }
    pthread_mutex_lock(&f->mu);
    if (find(f, id) < 0)
        add(f, id, f->entry_bytes, 0);
    evict(f);
    pthread_mutex_unlock(&f->mu);
    return 1;
}

static void f_drop(void *b, struct kvtier_key key)
{
    struct tfile *f = b;
    uint8_t id[32];
    char path[4096];
    make_id(id, f->fp, key);
    id_path(f, id, path, sizeof path);
    unlink(path);
    pthread_mutex_lock(&f->mu);
    int32_t x = find(f, id);
    if (x >= 0)
        remove_node(f, x);
    pthread_mutex_unlock(&f->mu);
}

static void f_stats(void *b, struct kvtier_tier_stats *st)
{
    struct tfile *f = b;
    pthread_mutex_lock(&f->mu);
    st->entries = f->entries;
    st->bytes = f->bytes;
    st->evictions = f->evictions;
    pthread_mutex_unlock(&f->mu);
}

static void f_describe(void *b, char *buf, size_t cap)
{
    struct tfile *f = b;
    pthread_mutex_lock(&f->mu);
    snprintf(buf, cap, "file %s (%.1f of %.1f GiB, %llu entries)", f->dir,
             (double)f->bytes / (1 << 30), (double)f->max_bytes / (1 << 30),
             (unsigned long long)f->entries);
    pthread_mutex_unlock(&f->mu);
}

static void f_close(void *b)
{
    struct tfile *f = b;
    pthread_mutex_destroy(&f->mu);
    wfree(f->v);
    wfree(f->buckets);
    wfree(f->dir);
    wfree(f);
}

static const struct tier_ops file_ops = {f_get_run, f_put, f_drop, f_stats, f_describe, f_close};

/* mkdir -p */
static int make_dirs(const char *path)
{
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf)
        return -1;
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++)
        if (buf[i] == '/' || buf[i] == 0) {
            char c = buf[i];
            buf[i] = 0;
            if (mkdir(buf, 0755) && errno != EEXIST)
                return -1;
            buf[i] = c;
        }
    return 0;
}

int tier_file_open(void **b, const struct tier_ops **ops, const char *dir, uint64_t max_bytes,
                   const uint8_t fingerprint[16], size_t entry_bytes, struct weld_err *e)
{
    *b = NULL;
    struct tfile *f = wcalloc(1, sizeof *f);
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/')
        dl--;
    if (f)
        f->dir = wmalloc(dl + 1);
    if (!f || !f->dir) {
        if (f)
            wfree(f);
        return err_set(e, WELD_ERR_NOMEM, "--kv-offload-dir: out of memory");
    }
    memcpy(f->dir, dir, dl);
    f->dir[dl] = 0;
    memcpy(f->fp, fingerprint, 16);
    f->entry_bytes = entry_bytes;
    f->max_bytes = max_bytes;
    f->free_head = f->lru_head = f->lru_tail = -1;
    pthread_mutex_init(&f->mu, NULL);
    char sub[4096], fph[33];
    tier_hex16(fph, fingerprint);
    snprintf(sub, sizeof sub, "%s/%s", f->dir, fph);
    int rc = WELD_OK;
    if (rehash(f, 2048))
        rc = err_set(e, WELD_ERR_NOMEM, "--kv-offload-dir: out of memory");
    else if (make_dirs(sub) || access(sub, W_OK))
        rc = err_set(e, WELD_ERR_IO,
                     "--kv-offload-dir %s: cannot create or write %s: %s "
                     "(give a writable directory)",
                     dir, sub, strerror(errno));
    else if (scan(f))
        rc = err_set(e, WELD_ERR_IO, "--kv-offload-dir %s: cannot read it: %s", dir,
                     strerror(errno));
    if (rc) {
        f_close(f);
        return rc;
    }
    *b = f;
    *ops = &file_ops;
    return WELD_OK;
}
