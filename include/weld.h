/*
 * weld.h - the public C API of weld, an LLM inference and serving engine.
 *
 * Only opaque handles, status codes and create/free pairs live here; everything else is
 * internal and may change. The library never calls exit(): every fallible call returns an
 * enum weld_status and, where it takes one, fills a struct weld_err with a message that
 * names the file, offset or field at fault.
 */
#ifndef WELD_H
#define WELD_H

#ifdef __cplusplus
extern "C" {
#endif

#define WELD_VERSION_MAJOR 0
#define WELD_VERSION_MINOR 1
#define WELD_VERSION_PATCH 0
#define WELD_VERSION_STRING "0.1.0"

enum weld_status {
    WELD_OK = 0,
    WELD_ERR_IO,          /* open/read/write/mmap failed */
    WELD_ERR_FORMAT,      /* a file or request is malformed */
    WELD_ERR_UNSUPPORTED, /* well-formed, but not something weld can run */
    WELD_ERR_NOMEM,       /* an allocation failed */
    WELD_ERR_INVALID_ARG, /* the caller passed a bad value */
    WELD_ERR_NOT_FOUND,   /* a named file, tensor, key or backend does not exist */
    WELD_ERR_LIMIT,       /* a configured limit (context, memory, size) was exceeded */
    WELD_ERR_INTERNAL,    /* a bug in weld */
};

/* A caller-owned error slot: status and a human-readable message. */
struct weld_err {
    enum weld_status status;
    char msg[1024];
};

/* Name of a status, e.g. "format error". Never NULL. */
const char *weld_status_str(enum weld_status s);

/* Version string of the library, e.g. "0.1.0". */
const char *weld_version(void);

#ifdef __cplusplus
}
#endif

#endif /* WELD_H */
