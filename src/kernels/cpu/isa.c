/*
 * isa - CPU feature detection and the once-per-process choice of kernel instruction set
 * (see isa.h). The feature lists here must match the -m flags CMakeLists.txt gives
 * *_avx2.c and *_avx512.c files.
 */
#include "kernels/cpu/isa.h"

#include "core/err.h"

#include <pthread.h>
#include <stdatomic.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const isa_names[ISA_COUNT] = {"scalar", "avx2", "avx512", "amx"};

const char *isa_name(enum isa_level l)
{
    return (unsigned)l < ISA_COUNT ? isa_names[l] : "unknown";
}

unsigned isa_amd_family(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (!__builtin_cpu_is("amd"))
        return 0;
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    unsigned fam = (a >> 8) & 0xf;
    return fam == 0xf ? fam + ((a >> 20) & 0xff) : fam;
#else
    return 0;
#endif
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* CPUID.1:ECX bit 29 (clang 14's __builtin_cpu_supports does not know "f16c"). */
static bool cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}

#if defined(__linux__)
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static bool amx_granted;

static void amx_ask(void)
{
    /* ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA (asm/prctl.h, not in every libc's headers) */
    amx_granted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}
#endif

/* AMX-TILE and AMX-INT8 (CPUID.(7,0):EDX bits 24, 25), tile state enabled by the OS
   (XCR0 bits 17, 18), and the process's permission to use it, asked for once: Linux hands
   out tile data only after ARCH_REQ_XCOMP_PERM (a refusal, or another OS, means no AMX).
   Returns the missing piece or NULL. */
static const char *amx_missing(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)))
        return "amx-tile";
    if (!(d & (1u << 25)))
        return "amx-int8";
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    if ((lo & (3u << 17)) != (3u << 17))
        return "amx tile state enabled by the OS (XCR0)";
#if defined(__linux__)
    pthread_once(&amx_once, amx_ask);
    return amx_granted ? NULL : "permission to use amx tile data (arch_prctl refused)";
#else
    return "amx support in this OS build";
#endif
}
#endif

/* First feature of level l the CPU lacks, or NULL if it has them all. */
static const char *isa_missing(enum isa_level l)
{
    if (l == ISA_SCALAR)
        return NULL;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2"))
        return "avx2";
    if (!__builtin_cpu_supports("fma"))
        return "fma";
    if (!cpu_has_f16c())
        return "f16c";
    if (!__builtin_cpu_supports("bmi2"))
        return "bmi2";
    if (l == ISA_AVX2)
        return NULL;
    if (!__builtin_cpu_supports("avx512f"))
        return "avx512f";
    if (!__builtin_cpu_supports("avx512bw"))
        return "avx512bw";
    if (!__builtin_cpu_supports("avx512vl"))
        return "avx512vl";
    if (!__builtin_cpu_supports("avx512dq"))
        return "avx512dq";
    if (!__builtin_cpu_supports("avx512vnni"))
        return "avx512vnni";
    if (!__builtin_cpu_supports("avx512bf16"))
        return "avx512bf16";
    if (l == ISA_AVX512)
        return NULL;
    return l == ISA_AMX ? amx_missing() : "unknown level";
#else
    return "x86-64";
#endif
}

/* Answers of isa_cpu_has, asked once per level: CPUID traps to the hypervisor in a
   virtual machine (microseconds), and kernels ask for their ops per call (an LM head's
   scan did, every tile: 9-13% of a small model's decode time on a Zen 3 VM).
   0: not asked yet, 1: has it, 2: lacks it. */
static _Atomic int cpu_has_cache[ISA_COUNT];

bool isa_cpu_has(enum isa_level l)
{
    if ((unsigned)l >= ISA_COUNT)
        return false;
    int c = atomic_load_explicit(&cpu_has_cache[l], memory_order_relaxed);
    if (!c) {
        c = isa_missing(l) == NULL ? 1 : 2;
        atomic_store_explicit(&cpu_has_cache[l], c, memory_order_relaxed);
    }
    return c == 1;
}

enum isa_level isa_best(void)
{
    for (int l = ISA_COUNT - 1; l > ISA_SCALAR; l--)
        if (isa_cpu_has((enum isa_level)l))
            return (enum isa_level)l;
    return ISA_SCALAR;
}

int isa_resolve(const char *value, enum isa_level *out, struct weld_err *e)
{
    *out = ISA_SCALAR;
    if (!value || !*value || strcasecmp(value, "auto") == 0) {
        *out = isa_best();
        return WELD_OK;
    }
    for (int l = 0; l < ISA_COUNT; l++) {
        if (strcasecmp(value, isa_names[l]) != 0)
            continue;
        const char *miss = isa_missing((enum isa_level)l);
        if (miss)
            return err_set(e, WELD_ERR_UNSUPPORTED,
                           "WELD_ISA=%s: this CPU lacks %s (best available: %s)", value, miss,
                           isa_name(isa_best()));
        *out = (enum isa_level)l;
        return WELD_OK;
    }
    return err_set(e, WELD_ERR_INVALID_ARG,
                   "WELD_ISA=%s: unknown instruction set (expected scalar, avx2, avx512, amx or auto)",
                   value);
}

static pthread_once_t isa_once = PTHREAD_ONCE_INIT;
static enum isa_level isa_chosen = ISA_SCALAR;
static int isa_status = WELD_OK;
static struct weld_err isa_err;

static void isa_init_once(void)
{
    isa_status = isa_resolve(getenv("WELD_ISA"), &isa_chosen, &isa_err);
    if (isa_status != WELD_OK)
        isa_chosen = ISA_SCALAR;
}

int isa_init(struct weld_err *e)
{
    pthread_once(&isa_once, isa_init_once);
    if (isa_status != WELD_OK && e)
        *e = isa_err;
    return isa_status;
}

enum isa_level isa_active(void)
{
    isa_init(NULL);
    return isa_chosen;
}
