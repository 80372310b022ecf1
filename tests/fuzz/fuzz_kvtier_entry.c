/*
 * fuzz_kvtier_entry - libFuzzer target for what the KV tier reads back: the bytes of an
 * entry file are untrusted (a shared directory, a damaged disk, another program). The
 * input is written as the entry of one key in a file tier, then read with kvtier_get_run
 * behind a valid entry; a read may only ever return the valid block and, for the fuzzed
 * one, a block whose header and checksums hold. input[0] picks the shape: odd = the rest
 * is the whole file as is; even = the rest is a payload given a correct header, then the
 * byte at offset (input[1], input[2]) of the file is XORed with input[3] (so the fuzzer
 * reaches the checks past the header). Nothing is committed besides the seeds.
 */
#include "kvtier/kvtier.h"

#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BB 256

static char dir[128];
static struct kvtier *tier;
static const uint8_t FP[16] = {7, 7, 7};

static void write_file(struct kvtier_key k, const uint8_t *p, size_t n)
{
    char name[128], path[512];
    kvtier_entry_name(name, sizeof name, FP, k);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        abort();
    if (n)
        fwrite(p, 1, n, f);
    fclose(f);
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    (void)st, (void)flag, (void)f;
    return remove(p);
}

static void cleanup(void)
{
    kvtier_close(tier);
    nftw(dir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!tier) {
        atexit(cleanup);
        snprintf(dir, sizeof dir, "/tmp/weld_fuzz_kvtier_%ld", (long)getpid());
        struct kvtier_config c = {.dir = dir, .block_bytes = BB};
        memcpy(c.fingerprint, FP, 16);
        struct weld_err e;
        if (kvtier_open(&tier, &c, &e))
            abort();
    }
    struct kvtier_key k0 = {1, 2}, k1 = {3, 4};
    uint8_t good[KVTIER_HEADER_BYTES + BB];
    for (int i = 0; i < BB; i++)
        good[KVTIER_HEADER_BYTES + i] = (uint8_t)i;
    kvtier_header_make(good, FP, k0, good + KVTIER_HEADER_BYTES, BB);
    write_file(k0, good, sizeof good);
    if (size == 0 || size > 65536)
        return 0;
    if (data[0] & 1) {
        write_file(k1, data + 1, size - 1);
    } else {
        uint8_t e[KVTIER_HEADER_BYTES + BB] = {0};
        size_t n = size > 4 ? size - 4 : 0;
        memcpy(e + KVTIER_HEADER_BYTES, data + (size > 4 ? 4 : size), n < BB ? n : BB);
        kvtier_header_make(e, FP, k1, e + KVTIER_HEADER_BYTES, BB);
        if (size >= 4)
            e[((size_t)data[1] << 8 | data[2]) % sizeof e] ^= data[3];
        write_file(k1, e, sizeof e);
    }
    struct kvtier_key keys[2] = {k0, k1};
    uint8_t out[2 * BB];
    int got = kvtier_get_run(tier, keys, 2, out);
    if (got < 1 || memcmp(out, good + KVTIER_HEADER_BYTES, BB))
        abort(); /* the valid entry must always read back */
    return 0;
}
