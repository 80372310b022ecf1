/*
 * gate - the accept loop in front of libmicrohttpd, so that one client cannot take the
 * server down.
 *
 * libmicrohttpd (MHD) gives each connection a thread from the moment it is accepted and,
 * in the 0.9.7x series, waits for a full request line however odd its first bytes are.
 * The gate owns the listening socket instead. Its one thread accepts, keeps each new
 * connection in a poll() set until its first bytes arrive, looks at them with MSG_PEEK
 * (nothing is consumed) and only then hands the socket to MHD (MHD_add_connection):
 *   - a first line that does not start with a method token (a NUL byte, a TLS hello, ...)
 *     is answered 400 and closed at once;
 *   - a connection that sends nothing within send_timeout is answered 408 and closed;
 *     until then it costs a descriptor, not a thread;
 *   - a client address already holding per_client connections (waiting here or in MHD) is
 *     answered 429 at accept; more than max_connections waiting here: 503;
 *   - once MHD holds max_connections - reserve connections, only GET/HEAD /health,
 *     /metrics and /version are let in (others: 503), so those answer while every other
 *     slot is taken; at max_connections everything gets 503.
 * The counts of what MHD holds (total and per address) are raised here at hand-over and
 * lowered by MHD's connection-closed notification (gate_notify), under mu; so they never
 * fall below MHD's own and MHD never refuses a socket the gate hands it. Refusals are
 * reported to the server (answered: /metrics counts them) and logged at most once per
 * 10 s with their counts and the last address.
 *
 * Invariants: pend and pfd belong to the gate thread; held/n_held/total to mu. The gate
 * only answers with a complete HTTP/1.1 response and "Connection: close", then drains
 * what the client already sent so the close does not reset the answer away.
 */
#include "httpd/gate.h"

#include "core/alloc.h"
#include "core/log.h"
#include "core/progress.h"
#include "httpd/httpd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct pend {
    int fd;
    struct sockaddr_in sa;
    double t0;      /* accepted at (time_now) */
    double recheck; /* a partial first line: look again at this time */
};

struct held {
    uint32_t ip; /* network order */
    int n;
};

struct gate {
    struct gate_opts o;
    struct MHD_Daemon *d;
    pthread_t th;
    bool started;
    int wake[2];
    pthread_mutex_t mu;
    struct held *held; /* (n_held), under mu */
    int n_held, total; /* under mu */
    struct pend *pend; /* (n_pend), gate thread */
    int n_pend, cap;
    struct pollfd *pfd;  /* (cap + 2) */
    double listen_pause; /* out of descriptors: accept again at this time */
    /* refusals since the last log line */
    long n_refused[4]; /* 400, 408, 429, 503 */
    char last_ip[INET_ADDRSTRLEN];
    double t_log;
};

/* ---- counts of what MHD holds ----------------------------------------------------------- */

static void held_add(struct gate *g, uint32_t ip, int d)
{
    pthread_mutex_lock(&g->mu);
    int i = 0;
    while (i < g->n_held && g->held[i].ip != ip)
        i++;
    if (i == g->n_held && d > 0 && g->n_held < g->o.max_connections)
        g->held[g->n_held++] = (struct held){ip, 0};
    if (i < g->n_held) {
        g->held[i].n += d;
        if (g->held[i].n <= 0)
            g->held[i] = g->held[--g->n_held];
    }
    g->total += d;
    pthread_mutex_unlock(&g->mu);
}

static void held_get(struct gate *g, uint32_t ip, int *n_ip, int *total)
{
    pthread_mutex_lock(&g->mu);
    *n_ip = 0;
    for (int i = 0; i < g->n_held; i++)
        if (g->held[i].ip == ip)
            *n_ip = g->held[i].n;
    *total = g->total;
    pthread_mutex_unlock(&g->mu);
}

void gate_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                 enum MHD_ConnectionNotificationCode code)
{
    struct gate *g = cls;
    (void)socket_context;
    if (code != MHD_CONNECTION_NOTIFY_CLOSED)
        return;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ci && ci->client_addr && ci->client_addr->sa_family == AF_INET)
        held_add(g, ((const struct sockaddr_in *)(const void *)ci->client_addr)->sin_addr.s_addr,
                 -1);
}

/* ---- answers ---------------------------------------------------------------------------- */

static void note_refusal(struct gate *g, int status, const struct sockaddr_in *sa)
{
    int k = status == 400 ? 0 : status == 408 ? 1 : status == 429 ? 2 : 3;
    g->n_refused[k]++;
    inet_ntop(AF_INET, &sa->sin_addr, g->last_ip, sizeof g->last_ip);
    double now = time_now();
    if (now - g->t_log < 10)
        return;
    g->t_log = now;
    log_warn("refused connections: %ld bad request line (400), %ld sent nothing "
             "in %.0f s (408), %ld over --max-connections-per-client %d (429), %ld server full "
             "(503); last from %s",
             g->n_refused[0], g->n_refused[1], g->o.send_timeout, g->n_refused[2], g->o.per_client,
             g->n_refused[3], g->last_ip);
    memset(g->n_refused, 0, sizeof g->n_refused);
}

/* Answer status with an OpenAI error object, then close fd. */
static void refuse(struct gate *g, int fd, const struct sockaddr_in *sa, int status,
                   const char *msg)
{
    json_t *j = httpd_error_json(status, NULL, NULL, NULL, msg);
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    const char *reason = status == 400   ? "Bad Request"
                         : status == 408 ? "Request Timeout"
                         : status == 429 ? "Too Many Requests"
                                         : "Service Unavailable";
    char head[256];
    int nh = snprintf(head, sizeof head,
                      "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                      status, reason, body ? strlen(body) : 0);
    if (send(fd, head, (size_t)nh, MSG_NOSIGNAL | MSG_DONTWAIT | (body ? MSG_MORE : 0)) == nh &&
        body)
        (void)!send(fd, body, strlen(body), MSG_NOSIGNAL | MSG_DONTWAIT);
    free(body);
    char junk[4096];
    for (int i = 0; i < 16 && recv(fd, junk, sizeof junk, MSG_DONTWAIT) > 0; i++)
        ;
    shutdown(fd, SHUT_WR);
    close(fd);
    if (g->o.answered)
        g->o.answered(g->o.cls, status);
    note_refusal(g, status, sa);
}

/* ---- the first bytes -------------------------------------------------------------------- */

enum verdict { V_WAIT, V_PASS, V_BAD, V_BUSY };

static bool tchar(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* b: the first n bytes sent. cheap_only: only the reserved routes may come in. */
static enum verdict classify(const char *b, size_t n, bool cheap_only)
{
    static const char *const cheap[] = {"GET /health",   "HEAD /health", "GET /metrics",
                                        "HEAD /metrics", "GET /version", "HEAD /version"};
    size_t i = 0;
    while (i < n && (b[i] == '\r' || b[i] == '\n')) /* empty lines before a request: allowed */
        i++;
    if (i == n)
        return i >= 16 ? V_BAD : V_WAIT;
    for (size_t j = i; j < n && b[j] != ' '; j++)
        if (!tchar((unsigned char)b[j]))
            return V_BAD;
    if (!cheap_only)
        return V_PASS;
    b += i, n -= i;
    for (size_t k = 0; k < sizeof cheap / sizeof cheap[0]; k++) {
        size_t l = strlen(cheap[k]);
        if (n <= l && !memcmp(b, cheap[k], n))
            return V_WAIT;
        if (n > l && !memcmp(b, cheap[k], l) && (b[l] == ' ' || b[l] == '?'))
            return V_PASS;
    }
    return V_BUSY;
}

static void pend_drop(struct gate *g, int k)
{
    g->pend[k] = g->pend[--g->n_pend];
}

/* Pending connection k is readable (or due): decide. */
static void examine(struct gate *g, int k, double now)
{
    struct pend *p = &g->pend[k];
    char b[64];
    ssize_t n = recv(p->fd, b, sizeof b, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        close(p->fd);
        pend_drop(g, k);
        return;
    }
    if (n < 0)
        return;
    int n_ip, total;
    held_get(g, p->sa.sin_addr.s_addr, &n_ip, &total);
    enum verdict v = classify(b, (size_t)n, total >= g->o.max_connections - g->o.reserve);
    if (v == V_PASS && total >= g->o.max_connections)
        v = V_BUSY;
    switch (v) {
    case V_WAIT: p->recheck = now + 0.02; return;
    case V_BAD:
        refuse(g, p->fd, &p->sa, 400,
               "malformed request line: expected 'METHOD /path "
               "HTTP/1.1'");
        break;
    case V_BUSY:
        refuse(g, p->fd, &p->sa, 503,
               "the server has no free connection for this request; "
               "retry later");
        break;
    case V_PASS:
        held_add(g, p->sa.sin_addr.s_addr, +1);
        if (MHD_add_connection(g->d, p->fd, (const struct sockaddr *)&p->sa, sizeof p->sa) !=
            MHD_YES)
            held_add(g, p->sa.sin_addr.s_addr, -1); /* MHD closed the socket */
        break;
    }
    pend_drop(g, k);
}

static void accept_some(struct gate *g, double now)
{
    for (int i = 0; i < 64; i++) {
        struct sockaddr_in sa;
        socklen_t sl = sizeof sa;
        int fd = accept4(g->o.listen_fd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                if (now - g->t_log >= 10) {
                    g->t_log = now;
                    log_warn("cannot accept connections: %s (raise ulimit -n or "
                             "lower --max-connections)",
                             strerror(errno));
                }
                g->listen_pause = now + 0.1;
            }
            return;
        }
        if (sl < sizeof sa || sa.sin_family != AF_INET) {
            close(fd);
            continue;
        }
        int n_ip, total;
        held_get(g, sa.sin_addr.s_addr, &n_ip, &total);
        for (int k = 0; k < g->n_pend && g->o.per_client; k++)
            n_ip += g->pend[k].sa.sin_addr.s_addr == sa.sin_addr.s_addr;
        char msg[160];
        if (g->o.per_client && n_ip >= g->o.per_client) {
            snprintf(msg, sizeof msg,
                     "too many connections from your address (the limit is "
                     "%d, --max-connections-per-client)",
                     g->o.per_client);
            refuse(g, fd, &sa, 429, msg);
        } else if (g->n_pend >= g->cap) {
            refuse(g, fd, &sa, 503,
                   "too many connections are waiting to send a request; "
                   "retry later");
        } else {
            g->pend[g->n_pend++] = (struct pend){fd, sa, now, 0};
        }
    }
}

static void *gate_main(void *arg)
{
    struct gate *g = arg;
    for (;;) {
        double now = time_now();
        int n = 0, li = -1;
        g->pfd[n++] = (struct pollfd){.fd = g->wake[0], .events = POLLIN};
        double next = now + 1.0;
        if (now >= g->listen_pause) {
            li = n;
            g->pfd[n++] = (struct pollfd){.fd = g->o.listen_fd, .events = POLLIN};
        } else if (g->listen_pause < next) {
            next = g->listen_pause;
        }
        int base = n;
        for (int k = 0; k < g->n_pend; k++) {
            const struct pend *p = &g->pend[k];
            double due = p->t0 + g->o.send_timeout;
            if (p->recheck > now && p->recheck < due)
                due = p->recheck;
            if (due < next)
                next = due;
            g->pfd[n++] = (struct pollfd){.fd = p->recheck > now ? -1 : p->fd, .events = POLLIN};
        }
        double wait_ms = (next - now) * 1000 + 1;
        int r = poll(g->pfd, (nfds_t)n, wait_ms < 0 ? 0 : wait_ms > 1000 ? 1000 : (int)wait_ms);
        if (r < 0 && errno != EINTR) {
            log_error("gate: poll: %s", strerror(errno));
            break;
        }
        if (r > 0 && g->pfd[0].revents)
            break;
        now = time_now();
        int n_old = g->n_pend;
        for (int k = n_old - 1; k >= 0; k--) {
            struct pend *p = &g->pend[k];
            if ((r > 0 && g->pfd[base + k].revents) || (p->recheck && now >= p->recheck))
                examine(g, k, now);
            else if (now >= p->t0 + g->o.send_timeout) {
                char msg[128];
                snprintf(msg, sizeof msg, "no request within %.0f s (--send-timeout)",
                         g->o.send_timeout);
                refuse(g, p->fd, &p->sa, 408, msg);
                pend_drop(g, k);
            }
        }
        if (li >= 0 && r > 0 && (g->pfd[li].revents & POLLIN))
            accept_some(g, now);
    }
    return NULL;
}

/* ---- life ------------------------------------------------------------------------------- */

int gate_new(struct gate **out, const struct gate_opts *o, struct weld_err *e)
{
    struct gate *g = wcalloc(1, sizeof *g);
    if (!g)
        return err_set(e, WELD_ERR_NOMEM, "out of memory");
    g->o = *o;
    g->cap = o->max_connections;
    g->wake[0] = g->wake[1] = -1;
    g->held = wcalloc((size_t)g->cap, sizeof *g->held);
    g->pend = wcalloc((size_t)g->cap, sizeof *g->pend);
    g->pfd = wcalloc((size_t)g->cap + 2, sizeof *g->pfd);
    pthread_mutex_init(&g->mu, NULL);
    g->t_log = -1e9;
    if (!g->held || !g->pend || !g->pfd || pipe2(g->wake, O_CLOEXEC | O_NONBLOCK)) {
        g->o.listen_fd = -1; /* still the caller's */
        gate_free(g);
        return err_set(e, WELD_ERR_NOMEM, "cannot set up the accept loop: %s",
                       strerror(errno ? errno : ENOMEM));
    }
    *out = g;
    return WELD_OK;
}

int gate_start(struct gate *g, struct MHD_Daemon *d, struct weld_err *e)
{
    g->d = d;
    if (pthread_create(&g->th, NULL, gate_main, g))
        return err_set(e, WELD_ERR_IO, "cannot start the accept thread");
    g->started = true;
    return WELD_OK;
}

void gate_stop(struct gate *g)
{
    if (!g)
        return;
    if (g->started) {
        (void)!write(g->wake[1], "x", 1);
        pthread_join(g->th, NULL);
        g->started = false;
    }
    for (int k = 0; k < g->n_pend; k++)
        close(g->pend[k].fd);
    g->n_pend = 0;
    if (g->o.listen_fd >= 0)
        close(g->o.listen_fd);
    g->o.listen_fd = -1;
}

void gate_free(struct gate *g)
{
    if (!g)
        return;
    gate_stop(g);
    for (int i = 0; i < 2; i++)
        if (g->wake[i] >= 0)
            close(g->wake[i]);
    pthread_mutex_destroy(&g->mu);
    wfree(g->held);
    wfree(g->pend);
    wfree(g->pfd);
    wfree(g);
}
