/*
 * isa - which x86-64 instruction set the CPU kernels use, picked once per process.
 *
 * Levels are cumulative: ISA_AVX2 means AVX2 + FMA + F16C + BMI2 (what *_avx2.c files are
 * compiled for); ISA_AVX512 means AVX-512 F/BW/VL/DQ + VNNI + BF16 on top of that (what
 * *_avx512.c files are compiled for: the compiler may emit any of those instructions
 * anywhere in such a file, so the level demands all of them, which leaves out pre-Zen4 and
 * pre-Sapphire-Rapids AVX-512 parts; they run the AVX2 path). ISA_AMX adds Intel AMX
 * (AMX-TILE + AMX-INT8, what *_amx.c files are compiled for on top of the AVX-512 flags)
 * and the OS's permission to use its tile data (Linux arch_prctl ARCH_REQ_XCOMP_PERM,
 * requested when the level is first checked; refused or not Linux = no AMX level).
 *
 * Selection: isa_init() reads WELD_ISA once (scalar | avx2 | avx512 | amx; unset or "auto" = the
 * best level the CPU has). Forcing a level the CPU lacks is an error naming the missing
 * feature, never a silent fallback: a test that asked for avx512 must not pass on scalar.
 * The result (level or error) is cached, so every later call agrees. isa_resolve() is the
 * pure part, for tests. Detection uses __builtin_cpu_supports, which also checks that the
 * OS saves the wide registers (XGETBV). Non-x86 builds only ever have ISA_SCALAR.
 *
 * Thread-safe: isa_init() runs its body once (pthread_once).
 */
#ifndef WELD_KERNELS_CPU_ISA_H
#define WELD_KERNELS_CPU_ISA_H

#include "weld.h"

#include <stdbool.h>

enum isa_level { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2, ISA_AMX = 3, ISA_COUNT = 4 };

/* "scalar", "avx2", "avx512", "amx"; "unknown" out of range. */
const char *isa_name(enum isa_level l);

/* The CPU's family (CPUID.1: base family, plus the extended one when base is 0xF) when its
   vendor is AMD, else 0: 0x19 Zen 3 / Zen 4, 0x1A Zen 5. Kernels that pick a variant by
   core generation ask this once. */
unsigned isa_amd_family(void);

/* True if this CPU (and OS) can run code built for level l. ISA_SCALAR is always true. */
bool isa_cpu_has(enum isa_level l);

/* The best level this CPU has. */
enum isa_level isa_best(void);

/* Level for a WELD_ISA value (NULL, "" or "auto": isa_best()). Errors:
   WELD_ERR_INVALID_ARG for an unknown name, WELD_ERR_UNSUPPORTED for a level this CPU
   lacks (the message names the missing feature). */
int isa_resolve(const char *value, enum isa_level *out, struct weld_err *e);

/* Pick the level once from $WELD_ISA (see isa_resolve); later calls return the cached
   result and message. */
int isa_init(struct weld_err *e);

/* The level picked by isa_init() (which it calls if needed); ISA_SCALAR if that failed,
   so callers that skipped error handling still run, on the slow path. */
enum isa_level isa_active(void);

#endif
