/*
 * httpd - start and stop of the daemon behind the gate, and the small answers both HTTP
 * commands use (httpd.h says what each is for).
 *
 * Start: the options are checked (messages name the flag), the descriptor limit raised
 * toward what max_connections needs (a connection costs one descriptor in MHD and another
 * while it waits in the gate; a warning names ulimit -n when the hard limit is too low),
 * the socket bound and listening, the gate created (its notify callback must be given to
 * MHD at start), MHD started without a listening socket, then the gate's thread. Stop is
 * the reverse: the gate first (no new connection reaches MHD), then MHD, then the gate's
 * memory (MHD's close notifications reach the gate until MHD stopped).
 *
 * httpd_touch: MHD 0.9.75 restarts a connection's timer only when its timeout was 0, so it
 * sets 0 and then the value. httpd_client_gone polls the socket for a hang-up and peeks one
 * byte: a closed peer reads 0 bytes; bytes of a next pipelined request are not a hang-up.
 */
#include "httpd/httpd.h"

#include "core/alloc.h"
#include "core/log.h"
#include "httpd/gate.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

const char *httpd_error_type(int status)
{
    return status == 401   ? "authentication_error"
           : status >= 500 ? (status == 503 ? "service_unavailable" : "server_error")
                           : "invalid_request_error";
}

const char *httpd_error_code(int status)
{
    return status == 404   ? "model_not_found"
           : status == 413 ? "request_too_large"
           : status == 401 ? "invalid_api_key"
                           : NULL;
}

json_t *httpd_error_json(int status, const char *type, const char *param, const char *code,
                         const char *msg)
{
    json_t *o = json_object();
    json_object_set_new(o, "message", json_string(msg ? msg : ""));
    json_object_set_new(o, "type", json_string(type ? type : httpd_error_type(status)));
    json_object_set_new(o, "param", param && param[0] ? json_string(param) : json_null());
    if (!code)
        code = httpd_error_code(status);
    json_object_set_new(o, "code", code && code[0] ? json_string(code) : json_null());
    return json_pack("{s:o}", "error", o);
}

enum MHD_Result httpd_send(struct MHD_Connection *c, int status, const char *ctype,
                           const char *body, size_t len)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body,
                                                             MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

void httpd_touch(struct MHD_Connection *c, unsigned timeout_s)
{
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, timeout_s);
}

bool httpd_client_gone(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c,
                                                                 MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return false;
    struct pollfd pfd = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&pfd, 1, 0) <= 0)
        return false;
    if (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))
        return true;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void httpd_client_addr(struct MHD_Connection *c, char *out, size_t cap)
{
    const union MHD_ConnectionInfo *ci =
        c ? MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS) : NULL;
    snprintf(out, cap, "-");
    if (!ci || !ci->client_addr)
        return;
    const struct sockaddr *sa = ci->client_addr;
    char host[INET6_ADDRSTRLEN] = "";
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        snprintf(out, cap, "%s:%u", host, (unsigned)ntohs(in->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in = (const struct sockaddr_in6 *)(const void *)sa;
        inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof host);
        snprintf(out, cap, "[%s]:%u", host, (unsigned)ntohs(in->sin6_port));
    }
}

/* Every connection costs a descriptor in MHD and another while it waits in the gate. */
static void raise_fd_limit(int max_connections)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl))
        return;
    rlim_t need = (rlim_t)max_connections * 2 + 64;
    if (rl.rlim_cur < need && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur < need)
        log_warn("ulimit -n is %llu; --max-connections %d needs about %llu open files: raise "
                 "it (ulimit -n) or lower --max-connections",
                 (unsigned long long)rl.rlim_cur, max_connections, (unsigned long long)need);
}

static int check_opts(const struct httpd_opts *o, struct sockaddr_in *sa, struct weld_err *e)
{
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)o->port);
    const char *host = !strcmp(o->host, "localhost") ? "127.0.0.1" : o->host;
    if (inet_pton(AF_INET, host, &sa->sin_addr) != 1)
        return err_set(e, WELD_ERR_INVALID_ARG, "--host '%s': expected an IPv4 address", o->host);
    if (o->port < 0 || o->port > 65535)
        return err_set(e, WELD_ERR_INVALID_ARG, "--port %d: expected 0..65535", o->port);
    if (o->max_connections < 2 || o->max_connections_per_client < 0 || !(o->send_timeout > 0))
        return err_set(e, WELD_ERR_INVALID_ARG,
                       "--max-connections must be >= 2, "
                       "--max-connections-per-client >= 0 and --send-timeout > 0");
    return WELD_OK;
}

int httpd_start(struct httpd **out, const struct httpd_opts *o, struct weld_err *e)
{
    *out = NULL;
    struct sockaddr_in sa;
    int rc = check_opts(o, &sa, e);
    if (rc)
        return rc;
    struct httpd *h = wcalloc(1, sizeof *h);
    if (!h)
        return err_set(e, WELD_ERR_NOMEM, "out of memory");
    double t = o->send_timeout < 1 ? 1 : o->send_timeout > 86400 ? 86400 : o->send_timeout;
    h->timeout_s = (unsigned)t + (t > (unsigned)t);
    h->reserve = o->max_connections / 16 > 0 ? o->max_connections / 16 : 1;
    raise_fd_limit(o->max_connections);

    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, SOMAXCONN)) {
        int er = errno;
        if (fd >= 0)
            close(fd);
        wfree(h);
        return err_set(e, WELD_ERR_IO, "cannot listen on %s:%d (%s)", o->host, o->port,
                       strerror(er));
    }
    socklen_t sl = sizeof sa;
    h->port = getsockname(fd, (struct sockaddr *)&sa, &sl) ? o->port : ntohs(sa.sin_port);
    struct gate_opts go = {.listen_fd = fd,
                           .send_timeout = o->send_timeout,
                           .max_connections = o->max_connections,
                           .reserve = h->reserve,
                           .per_client = o->max_connections_per_client,
                           .answered = o->answered,
                           .cls = o->cls};
    if ((rc = gate_new(&h->gate, &go, e))) {
        close(fd);
        wfree(h);
        return rc;
    }
    h->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                                MHD_USE_POLL | MHD_USE_ITC | MHD_USE_NO_LISTEN_SOCKET,
                            0, NULL, NULL, o->access, o->cls, MHD_OPTION_NOTIFY_COMPLETED,
                            o->completed, o->cls, MHD_OPTION_NOTIFY_CONNECTION, gate_notify,
                            h->gate, MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_connections,
                            MHD_OPTION_CONNECTION_TIMEOUT, h->timeout_s, MHD_OPTION_END);
    if (!h->d)
        rc = err_set(e, WELD_ERR_IO, "cannot start the HTTP server (%s)",
                     errno ? strerror(errno) : "libmicrohttpd refused its options");
    else
        rc = gate_start(h->gate, h->d, e);
    if (rc) {
        httpd_free(h);
        return rc;
    }
    *out = h;
    return WELD_OK;
}

void httpd_stop_accepting(struct httpd *h)
{
    if (h)
        gate_stop(h->gate);
}

void httpd_free(struct httpd *h)
{
    if (!h)
        return;
    gate_stop(h->gate);
    if (h->d)
        MHD_stop_daemon(h->d);
    gate_free(h->gate);
    wfree(h);
}
