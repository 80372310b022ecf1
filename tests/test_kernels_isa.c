/*
 * isa (kernels/cpu/isa.h): detection against an independent reading of /proc/cpuinfo's
 * flags, WELD_ISA parsing and its errors, the cached once-per-process choice, and
 * gemm_ops_for() agreeing with detection. Also the bandwidth probe (bandwidth.h): its read
 * loops against a plain XOR of the buffer, argument errors, and a small real run; the
 * compute probe (peak.h): its loops' exact sums, which prove every chain ran every round,
 * the instruction per weight type, argument errors and a real run.
 */
#include "kernels/cpu/bandwidth.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/peak.h"
#include "test.h"

/* Does /proc/cpuinfo's first "flags" line list every word of want? -1 if unreadable. */
static int cpuinfo_has(const char *const *want, int n)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return -1;
    static char line[16384];
    int found = -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5) != 0)
            continue;
        found = 1;
        for (int i = 0; i < n; i++) {
            char pat[64];
            snprintf(pat, sizeof pat, " %s", want[i]);
            const char *p = line;
            int ok = 0;
            while ((p = strstr(p, pat)) != NULL) {
                char after = p[strlen(pat)];
                if (after == ' ' || after == '\n' || after == '\0') {
                    ok = 1;
                    break;
                }
                p++;
            }
            if (!ok)
                found = 0;
        }
        break;
    }
    fclose(f);
    return found;
}

TEST(detection_matches_cpuinfo)
{
    static const char *const avx2[] = {"avx2", "fma", "f16c", "bmi2"};
    static const char *const avx512[] = {"avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw",
                                         "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16"};
    static const char *const amx[] = {"avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw",
                                      "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16",
                                      "amx_tile", "amx_int8"};
    int h2 = cpuinfo_has(avx2, 4), h5 = cpuinfo_has(avx512, 10), ha = cpuinfo_has(amx, 12);
    if (h2 < 0) {
        printf("no /proc/cpuinfo flags: detection not cross-checked\n");
        return;
    }
    CHECK_EQ_INT(isa_cpu_has(ISA_AVX2), h2);
    CHECK_EQ_INT(isa_cpu_has(ISA_AVX512), h5);
    /* Linux lists amx_* only when it supports the tile state, so permission follows. */
    CHECK_EQ_INT(isa_cpu_has(ISA_AMX), ha);
    CHECK(isa_cpu_has(ISA_SCALAR));
    CHECK_EQ_INT(isa_best(), ha ? ISA_AMX : h5 ? ISA_AVX512 : h2 ? ISA_AVX2 : ISA_SCALAR);
    printf("this CPU: best %s\n", isa_name(isa_best()));
}

TEST(resolve)
{
    struct weld_err e = {0};
    enum isa_level l = ISA_COUNT;
    CHECK_EQ_INT(isa_resolve(NULL, &l, &e), WELD_OK);
    CHECK_EQ_INT(l, isa_best());
    CHECK_EQ_INT(isa_resolve("auto", &l, &e), WELD_OK);
    CHECK_EQ_INT(l, isa_best());
    CHECK_EQ_INT(isa_resolve("SCALAR", &l, &e), WELD_OK);
    CHECK_EQ_INT(l, ISA_SCALAR);
    CHECK_EQ_INT(isa_resolve("sse9", &l, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "WELD_ISA=sse9") && strstr(e.msg, "avx512"));
    for (int i = ISA_AVX2; i < ISA_COUNT; i++) {
        int st = isa_resolve(isa_name((enum isa_level)i), &l, &e);
        if (isa_cpu_has((enum isa_level)i)) {
            CHECK_EQ_INT(st, WELD_OK);
            CHECK_EQ_INT(l, i);
        } else {
            CHECK_EQ_INT(st, WELD_ERR_UNSUPPORTED);
            CHECK(strstr(e.msg, "lacks") != NULL);
        }
    }
    CHECK_EQ_STR(isa_name(ISA_COUNT), "unknown");
}

TEST(ops_follow_detection)
{
    for (int i = 0; i < ISA_COUNT; i++) {
        const struct gemm_ops *o = gemm_ops_for((enum isa_level)i);
        CHECK_EQ_INT(o != NULL, isa_cpu_has((enum isa_level)i));
        if (o)
            CHECK_EQ_INT(o->isa, i);
    }
    CHECK(gemm_ops_for(ISA_COUNT) == NULL);
}

/* isa_init reads WELD_ISA once: changing it afterwards changes nothing. */
TEST(init_once)
{
    const char *env = getenv("WELD_ISA");
    struct weld_err e1 = {0}, e2 = {0};
    enum isa_level want;
    int st0 = isa_resolve(env, &want, NULL);
    int st1 = isa_init(&e1);
    CHECK_EQ_INT(st1, st0);
    CHECK_EQ_INT(isa_active(), st0 == WELD_OK ? want : ISA_SCALAR);
    setenv("WELD_ISA", "bogus", 1);
    int st2 = isa_init(&e2);
    CHECK_EQ_INT(st2, st1);
    CHECK_EQ_STR(e1.msg, e2.msg);
    CHECK_EQ_INT(isa_active(), st0 == WELD_OK ? want : ISA_SCALAR);
    CHECK_EQ_INT(gemm_ops_get()->isa, isa_active());
}

TEST(bandwidth_read_loops)
{
    const size_t n = (size_t)BW_STREAMS * 4096 * 3 + BW_STREAMS * 256;
    uint64_t *buf = aligned_alloc(64, n);
    REQUIRE(buf);
    uint64_t x = 0x9e3779b97f4a7c15ull, want = 0;
    for (size_t i = 0; i < n / 8; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        buf[i] = x;
        want ^= x;
    }
    CHECK(bw_read_scalar(buf, n) == want);
    if (isa_cpu_has(ISA_AVX512))
        for (int streams = 1; streams <= BW_STREAMS; streams += BW_STREAMS - 1)
            for (size_t pf = 0; pf <= 2048; pf += 1024)
                for (int pace = 0; pace <= 8; pace += 4)
                    CHECK(bw_read_avx512(buf, n, streams, pf, 2 * pf, pace) == want);
    free(buf);
}

TEST(bandwidth_probe)
{
    struct bw_result r;
    struct weld_err e = {0};
    CHECK_EQ_INT(bw_probe(1000, 1, 1, &r, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "bandwidth probe") != NULL);
    CHECK_EQ_INT(bw_probe(64u << 20, 0, 1, &r, &e), WELD_ERR_INVALID_ARG);
    CHECK_EQ_INT(bw_probe(64u << 20, 2, 0, &r, &e), WELD_ERR_INVALID_ARG);
    REQUIRE(bw_probe(64u << 20, 2, 3, &r, &e) == WELD_OK);
    CHECK(r.gb_s_best > 0.1 && r.gb_s_best < 1e4 && r.gb_s_median <= r.gb_s_best);
    CHECK(r.bytes <= (64u << 20) && r.bytes >= (60u << 20) && r.threads == 2 && r.passes == 3);
    CHECK_EQ_STR(r.isa, isa_cpu_has(ISA_AVX512) ? "avx512" : "scalar");
    REQUIRE(r.loop != NULL);
    CHECK(strncmp(r.loop, r.isa, strlen(r.isa)) == 0);
    CHECK(r.loops >= 1);
    printf("probe (64 MiB, 2 threads, mostly cache): best %.1f GB/s\n", r.gb_s_best);
}

/* The probe in steps (weld bench's paired share): one buffer, the probe, then single
   passes of the loop it picked; an unknown loop is refused by name. */
TEST(bandwidth_session)
{
    struct bw_session *s = NULL;
    struct weld_err e = {0};
    CHECK_EQ_INT(bw_session_open(&s, 1000, 1, &e), WELD_ERR_INVALID_ARG);
    CHECK(s == NULL);
    REQUIRE(bw_session_open(&s, 16u << 20, 2, &e) == WELD_OK);
    struct bw_result r;
    CHECK_EQ_INT(bw_session_probe(s, 0, &r, &e), WELD_ERR_INVALID_ARG);
    REQUIRE(bw_session_probe(s, 2, &r, &e) == WELD_OK);
    CHECK(r.gb_s_best > 0.1 && r.passes == 2 && r.threads == 2 && r.loop != NULL);
    double gb_s = 0;
    for (int i = 0; i < 3; i++) {
        REQUIRE(bw_session_pass(s, r.loop, &gb_s, &e) == WELD_OK);
        CHECK(gb_s > 0.1 && gb_s < 1e4);
    }
    CHECK_EQ_INT(bw_session_pass(s, "no such loop", &gb_s, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "no such loop") != NULL);
    bw_session_close(s);
    bw_session_close(NULL);
}

/* After n rounds, chain i's lanes hold i + n * (products per lane per round) * 2^-20 (exact
   while below 16); the loops return the sum of all of them (int8: a fold of XORs). */
TEST(peak_loops)
{
    if (!isa_cpu_has(ISA_AVX2))
        SKIP("no AVX2: the compute probe has no loop here");
    const uint64_t n = 1u << 17; /* 2 * n * 2^-20 = 1/4: chain 15 stays below 16 */
    const double d = (double)n / (1 << 20);
    /* AVX2: 12 chains x 8 lanes, one product per round */
    CHECK(peak_loop_avx2(PEAK_F32_FMA, n) == 8 * (66 + PEAK_ACC_AVX2 * d));
    CHECK(peak_loop_avx2(PEAK_BF16_DOT, n) == 0);
    CHECK_EQ_INT(peak_round_ops(PEAK_F32_FMA, ISA_AVX2), PEAK_ACC_AVX2 * 16);
    if (!isa_cpu_has(ISA_AVX512))
        return;
    CHECK(peak_loop_avx512(PEAK_F32_FMA, n) == 16 * (120 + PEAK_ACC * d));
    CHECK(peak_loop_avx512(PEAK_BF16_DOT, n) == 16 * (120 + PEAK_ACC * 2 * d));
    uint32_t fold = 0; /* chain i: i - 60 n (4 products of 3 x -5 per lane per round) */
    for (uint32_t i = 0; i < PEAK_ACC; i++)
        fold ^= i - 60u * (uint32_t)n;
    CHECK(peak_loop_avx512(PEAK_I8_DOT, n) == (double)(int32_t)(16u * fold));
    CHECK_EQ_INT(peak_round_ops(PEAK_BF16_DOT, ISA_AVX512), PEAK_ACC * 64);
    CHECK_EQ_INT(peak_round_ops(PEAK_I8_DOT, ISA_AVX512), PEAK_ACC * 128);
}

TEST(peak_probe)
{
    CHECK(peak_op_for(DT_BF16, ISA_AVX512) == PEAK_BF16_DOT);
    CHECK(peak_op_for(DT_BF16, ISA_AVX2) == PEAK_F32_FMA);
    CHECK(peak_op_for(DT_F16, ISA_AVX512) == PEAK_F32_FMA);
    CHECK(peak_op_for(DT_Q8_0, ISA_AVX512) == PEAK_I8_DOT);
    CHECK(peak_op_for(DT_Q8_0, ISA_AMX) == PEAK_NONE);
    CHECK(peak_op_for(DT_F32, ISA_SCALAR) == PEAK_NONE);
    struct peak_result r;
    struct weld_err e = {0};
    CHECK_EQ_INT(peak_probe(PEAK_F32_FMA, ISA_AVX2, 0, 1, &r, &e), WELD_ERR_INVALID_ARG);
    CHECK(strstr(e.msg, "compute probe") != NULL);
    CHECK_EQ_INT(peak_probe(PEAK_F32_FMA, ISA_AVX2, 1, 0, &r, &e), WELD_ERR_INVALID_ARG);
    CHECK_EQ_INT(peak_probe(PEAK_F32_FMA, ISA_SCALAR, 1, 1, &r, &e), WELD_ERR_UNSUPPORTED);
    CHECK(peak_instr(PEAK_NONE, ISA_AVX512) == NULL);
    enum isa_level l = isa_cpu_has(ISA_AVX512) ? ISA_AVX512 : ISA_AVX2;
    if (!isa_cpu_has(l))
        SKIP("no AVX2: the compute probe has no loop here");
    enum peak_op op = l == ISA_AVX512 ? PEAK_BF16_DOT : PEAK_F32_FMA;
    REQUIRE(peak_probe(op, l, 2, 2, &r, &e) == WELD_OK);
    CHECK(r.op == op && r.threads == 2 && r.passes == 2 && r.checksum > 0);
    CHECK_EQ_STR(r.instr, peak_instr(op, l));
    CHECK(r.gops_best > 1 && r.gops_best < 1e6 && r.gops_median <= r.gops_best);
    printf("compute probe (%s, 2 threads): best %.1f GFLOP/s\n", r.instr, r.gops_best);
}

int main(void)
{
    RUN(detection_matches_cpuinfo);
    RUN(resolve);
    RUN(ops_follow_detection);
    RUN(init_once);
    RUN(bandwidth_read_loops);
    RUN(bandwidth_probe);
    RUN(bandwidth_session);
    RUN(peak_loops);
    RUN(peak_probe);
    return test_summary();
}
