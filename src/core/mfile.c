/*
 * mfile - see mfile.h. POSIX open + fstat + mmap(PROT_READ, MAP_PRIVATE); the descriptor is
 * closed right after mapping.
 */
#include "core/mfile.h"

#include "core/alloc.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int mfile_open(struct mfile *m, const char *path, struct weld_err *e)
{
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return err_set(e, errno == ENOENT ? WELD_ERR_NOT_FOUND : WELD_ERR_IO,
                       "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int rc = err_set(e, WELD_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return rc;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(e, WELD_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return WELD_OK;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return err_set(e, WELD_ERR_IO, "%s: cannot mmap %lld bytes: %s", path,
                       (long long)st.st_size, strerror(errno));
    m->data = p;
    m->size = (size_t)st.st_size;
    m->owned = 1;
    return WELD_OK;
}

void mfile_wrap(struct mfile *m, const void *data, size_t size)
{
    m->data = data;
    m->size = size;
    m->owned = 0;
}

void mfile_close(struct mfile *m)
{
    if (m && m->owned && m->data)
        munmap((void *)m->data, m->size);
    if (m)
        memset(m, 0, sizeof *m);
}

int file_read_all(const char *path, char **out, size_t *len, struct weld_err *e)
{
    *out = NULL;
    if (len)
        *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return err_set(e, errno == ENOENT ? WELD_ERR_NOT_FOUND : WELD_ERR_IO,
                       "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = wmalloc(cap);
    if (!buf) {
        fclose(f);
        return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", path);
    }
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = wrealloc(buf, cap * 2);
            if (!nb) {
                wfree(buf);
                fclose(f);
                return err_set(e, WELD_ERR_NOMEM, "%s: out of memory", path);
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        wfree(buf);
        return err_set(e, WELD_ERR_IO, "%s: read error", path);
    }
    buf[n] = '\0';
    *out = buf;
    if (len)
        *len = n;
    return WELD_OK;
}

int file_write_all(const char *path, const void *data, size_t n, struct weld_err *e)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return err_set(e, WELD_ERR_INVALID_ARG, "%s: path too long", path);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return err_set(e, WELD_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    size_t w = n ? fwrite(data, 1, n, f) : 0;
    int bad = (w != n) | (fclose(f) != 0);
    if (bad || rename(tmp, path) != 0) {
        int rc = err_set(e, WELD_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        unlink(tmp);
        return rc;
    }
    return WELD_OK;
}

void mfile_prefault(const void *p, size_t n)
{
    if (!p || !n)
        return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)p / page * page, hi = (uintptr_t)p + n;
#ifdef MADV_POPULATE_READ
    if (madvise((void *)lo, hi - lo, MADV_POPULATE_READ) == 0)
        return;
#endif
    volatile const uint8_t *b = p;
    uint8_t sink = 0;
    for (uintptr_t a = lo < (uintptr_t)p ? lo + page : lo; a < hi; a += page)
        sink ^= b[a - (uintptr_t)p];
    sink ^= b[0];
    (void)sink;
}

int mfile_release(const struct mfile *m, const void *p, size_t n)
{
    const uint8_t *b = p;
    if (!m || !m->owned || !m->data || !b || b < m->data || n > m->size ||
        (size_t)(b - m->data) > m->size - n)
        return 0;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)b + page - 1) / page * page, hi = ((uintptr_t)b + n) / page * page;
    if (hi <= lo)
        return 0;
    return madvise((void *)lo, hi - lo, MADV_DONTNEED) == 0;
}
