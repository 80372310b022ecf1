/*
 * comm - MPI behind comm.h: lazy start, polled operations with deadlines, counters.
 *
 * Every operation posts the non-blocking MPI call (MPI_Ibcast, MPI_Iallgather, MPI_Isend,
 * MPI_Irecv, MPI_Ibarrier) and polls MPI_Test: spinning for the first 200 us (a step's
 * exchanges are microseconds apart on shared memory), then yielding the core, then after
 * 5 ms sleeping between polls, until the request completes or the deadline passes. A
 * request that missed its deadline is abandoned (MPI cannot cancel a collective), the
 * communicator is marked broken and the caller gets WELD_ERR_IO; the process is expected
 * to fail what it was doing and exit (comm_abort ends the other ranks).
 */
#include "comm/comm.h"

#include "core/alloc.h"
#include "core/log.h"

#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define COMM_SPIN_S 200e-6
#define COMM_YIELD_S 5e-3
#define COMM_SLEEP_NS 100000L
#define COMM_DEFAULT_TIMEOUT_S 60.0

struct comm {
    MPI_Comm mc;
    int rank, size;
    double timeout_s;
    bool broken;
    struct comm_stats st;
};

static int init_rc = -1; /* -1: not tried */
static char init_msg[256];
static char node[MPI_MAX_PROCESSOR_NAME + 1];

bool comm_launched(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE",
                                       "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i]))
            return true;
    return false;
}

int comm_init(struct weld_err *e)
{
    if (init_rc < 0) {
        int provided = 0, flag = 0;
        MPI_Initialized(&flag);
        int rc = flag ? MPI_SUCCESS : MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS) {
            init_rc = WELD_ERR_IO;
            snprintf(init_msg, sizeof init_msg, "MPI_Init_thread failed (error %d)", rc);
        } else if (!flag && provided < MPI_THREAD_MULTIPLE) {
            init_rc = WELD_ERR_UNSUPPORTED;
            snprintf(init_msg, sizeof init_msg,
                     "this MPI library gives thread level %d, "
                     "weld needs MPI_THREAD_MULTIPLE (%d)",
                     provided, MPI_THREAD_MULTIPLE);
        } else {
            init_rc = WELD_OK;
            int len = 0;
            MPI_Get_processor_name(node, &len);
            node[len < 0 ? 0 : len] = '\0';
            /* errors come back as codes, never as an abort inside MPI */
            MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        }
    }
    if (init_rc)
        return err_set(e, init_rc, "comm: %s", init_msg);
    return WELD_OK;
}

bool comm_initialized(void)
{
    return init_rc == WELD_OK;
}

int comm_world_rank(void)
{
    int r = 0;
    if (comm_initialized())
        MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

int comm_world_size(void)
{
    int n = 1;
    if (comm_initialized())
        MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

const char *comm_node_name(void)
{
    return node;
}

void comm_finalize(void)
{
    int fin = 0;
    if (comm_initialized() && (MPI_Finalized(&fin), !fin))
        MPI_Finalize();
}

_Noreturn void comm_abort(int code)
{
    if (comm_initialized())
        MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

int comm_create(struct comm **out, int color, int key, double timeout_s, struct weld_err *e)
{
    *out = NULL;
    int rc = comm_init(e);
    if (rc)
        return rc;
    struct comm *c = wcalloc(1, sizeof *c);
    if (!c)
        return err_set(e, WELD_ERR_NOMEM, "comm: out of memory");
    if (MPI_Comm_split(MPI_COMM_WORLD, color, key, &c->mc) != MPI_SUCCESS) {
        wfree(c);
        return err_set(e, WELD_ERR_IO, "comm: MPI_Comm_split failed");
    }
    MPI_Comm_set_errhandler(c->mc, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->mc, &c->rank);
    MPI_Comm_size(c->mc, &c->size);
    c->timeout_s = timeout_s > 0 ? timeout_s : COMM_DEFAULT_TIMEOUT_S;
    *out = c;
    return WELD_OK;
}

void comm_free(struct comm *c)
{
    if (!c)
        return;
    if (!c->broken)
        MPI_Comm_free(&c->mc);
    wfree(c);
}

int comm_rank(const struct comm *c)
{
    return c->rank;
}

int comm_size(const struct comm *c)
{
    return c->size;
}

bool comm_broken(const struct comm *c)
{
    return c->broken;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int check_usable(struct comm *c, const char *what, size_t n, struct weld_err *e)
{
    if (c->broken)
        return err_set(e, WELD_ERR_IO,
                       "comm: %s: the ranks lost each other in an earlier "
                       "operation",
                       what);
    if (n > INT_MAX)
        return err_set(e, WELD_ERR_LIMIT, "comm: %s of %zu bytes is over MPI's count limit", what,
                       n);
    return WELD_OK;
}

/* Poll request r until it completes (rc = WELD_OK) or the deadline passes. */
static int wait_req(struct comm *c, MPI_Request *r, const char *what, bool forever, int mpi_rc,
                    struct weld_err *e)
{
    const double t0 = now_s();
    if (mpi_rc != MPI_SUCCESS) {
        c->broken = true;
        return err_set(e, WELD_ERR_IO, "comm: %s failed to start (MPI error %d)", what, mpi_rc);
    }
    for (;;) {
        int done = 0;
        int rc = MPI_Test(r, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            c->broken = true;
            return err_set(e, WELD_ERR_IO, "comm: %s failed (MPI error %d): a rank is gone", what,
                           rc);
        }
        const double t = now_s() - t0;
        if (done) {
            c->st.wait_s += t;
            c->st.calls++;
            return WELD_OK;
        }
        if (!forever && t > c->timeout_s) {
            c->broken = true;
            return err_set(e, WELD_ERR_IO,
                           "comm: %s: no answer from the other ranks within "
                           "%.0f s (a rank died or hangs)",
                           what, c->timeout_s);
        }
        if (t > COMM_YIELD_S) {
            struct timespec ts = {0, COMM_SLEEP_NS};
            nanosleep(&ts, NULL);
        } else if (t > COMM_SPIN_S) {
            sched_yield();
        }
    }
}

int comm_bcast(struct comm *c, void *buf, size_t n, int root, bool wait_forever, struct weld_err *e)
{
    int rc = check_usable(c, "broadcast", n, e);
    if (rc || c->size == 1)
        return rc;
    MPI_Request r;
    rc = wait_req(c, &r, "broadcast", wait_forever,
                  MPI_Ibcast(buf, (int)n, MPI_BYTE, root, c->mc, &r), e);
    if (!rc) {
        if (c->rank == root)
            c->st.bytes_sent += (uint64_t)n * (uint64_t)(c->size - 1);
        else
            c->st.bytes_recv += n;
    }
    return rc;
}

int comm_allgather(struct comm *c, void *buf, size_t n, struct weld_err *e)
{
    int rc = check_usable(c, "allgather", n, e);
    if (rc || c->size == 1)
        return rc;
    MPI_Request r;
    rc = wait_req(c, &r, "allgather", false,
                  MPI_Iallgather(MPI_IN_PLACE, 0, MPI_BYTE, buf, (int)n, MPI_BYTE, c->mc, &r), e);
    if (!rc) {
        c->st.bytes_sent += (uint64_t)n * (uint64_t)(c->size - 1);
        c->st.bytes_recv += (uint64_t)n * (uint64_t)(c->size - 1);
    }
    return rc;
}

int comm_allgatherv(struct comm *c, const void *send, void *recv, const size_t *counts,
                    const size_t *displs, struct weld_err *e)
{
    int rc = check_usable(c, "allgather", 0, e);
    if (rc)
        return rc;
    int *cn = wcalloc((size_t)c->size, sizeof *cn), *ds = wcalloc((size_t)c->size, sizeof *ds);
    if (!cn || !ds) {
        wfree(cn), wfree(ds);
        return err_set(e, WELD_ERR_NOMEM, "comm: out of memory");
    }
    size_t got = 0;
    for (int r = 0; r < c->size; r++) {
        if (counts[r] > INT_MAX || displs[r] > INT_MAX) {
            wfree(cn), wfree(ds);
            return err_set(e, WELD_ERR_LIMIT,
                           "comm: allgather of %zu bytes is over MPI's "
                           "count limit",
                           counts[r]);
        }
        cn[r] = (int)counts[r], ds[r] = (int)displs[r];
        got += r == c->rank ? 0 : counts[r];
    }
    MPI_Request q;
    rc = wait_req(c, &q, "allgather", false,
                  MPI_Iallgatherv(send ? send : MPI_IN_PLACE, send ? cn[c->rank] : 0, MPI_BYTE,
                                  recv, cn, ds, MPI_BYTE, c->mc, &q),
                  e);
    wfree(cn), wfree(ds);
    if (!rc) {
        c->st.bytes_sent += counts[c->rank] * (size_t)(c->size - 1);
        c->st.bytes_recv += got;
    }
    return rc;
}

int comm_alltoallv(struct comm *c, const void *send, const size_t *scounts, const size_t *sdispls,
                   void *recv, const size_t *rcounts, const size_t *rdispls, struct weld_err *e)
{
    int rc = check_usable(c, "all-to-all", 0, e);
    if (rc)
        return rc;
    int *v = wcalloc(4 * (size_t)c->size, sizeof *v);
    if (!v)
        return err_set(e, WELD_ERR_NOMEM, "comm: out of memory");
    int *sc = v, *sd = v + c->size, *rcn = v + 2 * c->size, *rd = v + 3 * c->size;
    size_t sent = 0, got = 0;
    for (int r = 0; r < c->size; r++) {
        if (scounts[r] > INT_MAX || sdispls[r] > INT_MAX || rcounts[r] > INT_MAX ||
            rdispls[r] > INT_MAX) {
            wfree(v);
            return err_set(e, WELD_ERR_LIMIT, "comm: all-to-all over MPI's count limit");
        }
        sc[r] = (int)scounts[r], sd[r] = (int)sdispls[r];
        rcn[r] = (int)rcounts[r], rd[r] = (int)rdispls[r];
        sent += r == c->rank ? 0 : scounts[r];
        got += r == c->rank ? 0 : rcounts[r];
    }
    MPI_Request q;
    rc = wait_req(c, &q, "all-to-all", false,
                  MPI_Ialltoallv(send, sc, sd, MPI_BYTE, recv, rcn, rd, MPI_BYTE, c->mc, &q), e);
    wfree(v);
    if (!rc) {
        c->st.bytes_sent += sent;
        c->st.bytes_recv += got;
    }
    return rc;
}

int comm_send(struct comm *c, const void *buf, size_t n, int peer, int tag, struct weld_err *e)
{
    int rc = check_usable(c, "send", n, e);
    if (rc)
        return rc;
    MPI_Request r;
    rc = wait_req(c, &r, "send", false, MPI_Isend(buf, (int)n, MPI_BYTE, peer, tag, c->mc, &r), e);
    if (!rc)
        c->st.bytes_sent += n;
    return rc;
}

int comm_recv(struct comm *c, void *buf, size_t n, int peer, int tag, struct weld_err *e)
{
    int rc = check_usable(c, "receive", n, e);
    if (rc)
        return rc;
    MPI_Request r;
    rc = wait_req(c, &r, "receive", false, MPI_Irecv(buf, (int)n, MPI_BYTE, peer, tag, c->mc, &r),
                  e);
    if (!rc)
        c->st.bytes_recv += n;
    return rc;
}

struct comm_req {
    MPI_Request r;
    size_t sent, recv;    /* bytes, counted when it completes */
    int *counts, *displs; /* an allgatherv's: MPI reads them until it completes */
};

int comm_isend(struct comm *c, const void *buf, size_t n, int peer, int tag, struct comm_req **req,
               struct weld_err *e)
{
    *req = NULL;
    int rc = check_usable(c, "send", n, e);
    if (rc)
        return rc;
    struct comm_req *q = wcalloc(1, sizeof *q);
    if (!q)
        return err_set(e, WELD_ERR_NOMEM, "comm: out of memory");
    q->sent = n;
    if (MPI_Isend(buf, (int)n, MPI_BYTE, peer, tag, c->mc, &q->r) != MPI_SUCCESS) {
        wfree(q);
        c->broken = true;
        return err_set(e, WELD_ERR_IO, "comm: send to rank %d failed to start", peer);
    }
    *req = q;
    return WELD_OK;
}

int comm_wait(struct comm *c, struct comm_req *req, struct weld_err *e)
{
    if (!req)
        return WELD_OK;
    int rc = wait_req(c, &req->r, req->counts ? "allgather" : "send", false, MPI_SUCCESS, e);
    if (!rc) {
        c->st.bytes_sent += req->sent;
        c->st.bytes_recv += req->recv;
    }
    wfree(req->counts), wfree(req->displs);
    wfree(req);
    return rc;
}

int comm_iallgather_rows(struct comm *c, void *buf, size_t stride, size_t off, size_t n,
                         struct comm_req **req, struct weld_err *e)
{
    *req = NULL;
    int rc = check_usable(c, "allgather", n, e);
    if (rc)
        return rc;
    if ((size_t)c->size * stride > INT_MAX)
        return err_set(e, WELD_ERR_LIMIT,
                       "comm: allgather over %zu bytes is over MPI's count "
                       "limit",
                       (size_t)c->size * stride);
    struct comm_req *q = wcalloc(1, sizeof *q);
    int *counts = wcalloc((size_t)c->size, sizeof *counts);
    int *displs = wcalloc((size_t)c->size, sizeof *displs);
    if (!q || !counts || !displs) {
        wfree(q), wfree(counts), wfree(displs);
        return err_set(e, WELD_ERR_NOMEM, "comm: out of memory");
    }
    for (int r = 0; r < c->size; r++)
        counts[r] = (int)n, displs[r] = (int)((size_t)r * stride + off);
    q->sent = q->recv = n * (size_t)(c->size - 1);
    q->counts = counts, q->displs = displs;
    rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_BYTE, buf, counts, displs, MPI_BYTE, c->mc, &q->r);
    if (rc != MPI_SUCCESS) {
        wfree(counts), wfree(displs), wfree(q);
        c->broken = true;
        return err_set(e, WELD_ERR_IO, "comm: allgather failed to start (MPI error %d)", rc);
    }
    *req = q;
    return WELD_OK;
}

void comm_test(struct comm *c, struct comm_req *req)
{
    int done = 0;
    if (req && !c->broken)
        MPI_Test(&req->r, &done, MPI_STATUS_IGNORE);
}

int comm_barrier(struct comm *c, struct weld_err *e)
{
    int rc = check_usable(c, "barrier", 0, e);
    if (rc || c->size == 1)
        return rc;
    MPI_Request r;
    return wait_req(c, &r, "barrier", false, MPI_Ibarrier(c->mc, &r), e);
}

void comm_stats_get(struct comm *c, struct comm_stats *out, bool reset)
{
    *out = c->st;
    if (reset)
        memset(&c->st, 0, sizeof c->st);
}
