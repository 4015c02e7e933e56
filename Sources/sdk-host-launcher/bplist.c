// See bplist.h. The launcher is short-lived: what the reader allocates is never freed.
#include "bplist.h"

#include <stdlib.h>
#include <string.h>

static uint64_t be(const uint8_t *p, unsigned n) {
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

int bp_open(struct bp_doc *doc, const uint8_t *bytes, size_t length, const char **why) {
    if (length < 8 + 32 || memcmp(bytes, "bplist00", 8) != 0) {
        *why = "not a bplist00 document";
        return -1;
    }
    const uint8_t *t = bytes + length - 32;
    doc->bytes = bytes;
    doc->length = length;
    doc->offset_size = t[6];
    doc->ref_size = t[7];
    uint64_t objects = be(t + 8, 8), top = be(t + 16, 8), table = be(t + 24, 8);
    if (doc->offset_size < 1 || doc->offset_size > 8 || doc->ref_size < 1 || doc->ref_size > 8 || objects == 0 ||
        top >= objects || table < 8 || table >= length - 32 || objects > (length - 32 - table) / doc->offset_size) {
        *why = "malformed trailer";
        return -1;
    }
    doc->objects = (size_t)objects;
    doc->top = (size_t)top;
    doc->table = (size_t)table;
    return 0;
}

/// The byte offset of an object, or 0 (never a valid offset: the header is there) when out of range.
static size_t offset_of(const struct bp_doc *doc, size_t object) {
    if (object >= doc->objects) return 0;
    uint64_t off = be(doc->bytes + doc->table + object * doc->offset_size, doc->offset_size);
    if (off < 8 || off >= doc->table) return 0;
    return (size_t)off;
}

/// Reads a marker's count (the low nibble, or a following integer when it is 15). Sets *start to the first
/// byte after it. Returns -1 when malformed.
static int64_t count_at(const struct bp_doc *doc, size_t off, size_t *start) {
    uint8_t low = doc->bytes[off] & 0x0F;
    if (low != 0x0F) {
        *start = off + 1;
        return low;
    }
    if (off + 2 > doc->table || (doc->bytes[off + 1] & 0xF0) != 0x10) return -1;
    unsigned n = 1u << (doc->bytes[off + 1] & 0x0F);
    if (n > 8 || off + 2 + n > doc->table) return -1;
    uint64_t v = be(doc->bytes + off + 2, n);
    if (v > doc->length) return -1;
    *start = off + 2 + n;
    return (int64_t)v;
}

enum bp_kind bp_kind_of(const struct bp_doc *doc, size_t object) {
    size_t off = offset_of(doc, object);
    if (off == 0) return BP_NONE;
    uint8_t m = doc->bytes[off];
    if (m == 0x08 || m == 0x09) return BP_BOOL;
    switch (m >> 4) {
    case 0x1: return BP_INT;
    case 0x5: case 0x6: return BP_STRING;
    case 0xA: return BP_ARRAY;
    case 0xD: return BP_DICT;
    default: return BP_NONE;
    }
}

/// The ref at `index` of a container whose refs start at `start`; (size_t)-1 when out of range.
static size_t ref_at(const struct bp_doc *doc, size_t start, size_t index) {
    size_t at = start + index * doc->ref_size;
    if (at + doc->ref_size > doc->table) return (size_t)-1;
    uint64_t r = be(doc->bytes + at, doc->ref_size);
    return r < doc->objects ? (size_t)r : (size_t)-1;
}

char *bp_string(const struct bp_doc *doc, size_t object) {
    size_t off = offset_of(doc, object), start;
    if (off == 0) return NULL;
    uint8_t kind = doc->bytes[off] >> 4;
    if (kind != 0x5 && kind != 0x6) return NULL;
    int64_t n = count_at(doc, off, &start);
    if (n < 0) return NULL;
    size_t units = (size_t)n, width = kind == 0x5 ? 1 : 2;
    if (units > (doc->table - start) / width) return NULL;
    char *out = malloc(units * 3 + 1);
    if (out == NULL) return NULL;
    size_t w = 0;
    const uint8_t *p = doc->bytes + start;
    for (size_t i = 0; i < units; i++) {
        uint32_t c = width == 1 ? p[i] : (uint32_t)be(p + 2 * i, 2);
        if (width == 2 && c >= 0xD800 && c < 0xDC00 && i + 1 < units) {
            uint32_t lo = (uint32_t)be(p + 2 * (i + 1), 2);
            if (lo >= 0xDC00 && lo < 0xE000) {
                c = 0x10000 + ((c - 0xD800) << 10) + (lo - 0xDC00);
                i++;
            }
        }
        if (c == 0) return NULL;  // a path or argument cannot hold NUL
        if (c < 0x80) {
            out[w++] = (char)c;
        } else if (c < 0x800) {
            out[w++] = (char)(0xC0 | (c >> 6));
            out[w++] = (char)(0x80 | (c & 0x3F));
        } else if (c < 0x10000) {
            out[w++] = (char)(0xE0 | (c >> 12));
            out[w++] = (char)(0x80 | ((c >> 6) & 0x3F));
            out[w++] = (char)(0x80 | (c & 0x3F));
        } else {
            // 4 bytes: the 3-per-unit allowance covers it, as a pair took two units.
            out[w++] = (char)(0xF0 | (c >> 18));
            out[w++] = (char)(0x80 | ((c >> 12) & 0x3F));
            out[w++] = (char)(0x80 | ((c >> 6) & 0x3F));
            out[w++] = (char)(0x80 | (c & 0x3F));
        }
    }
    out[w] = 0;
    return out;
}

int bp_integer(const struct bp_doc *doc, size_t object, int64_t *out) {
    size_t off = offset_of(doc, object);
    if (off == 0) return -1;
    uint8_t m = doc->bytes[off];
    if (m == 0x08 || m == 0x09) {
        *out = m == 0x09;
        return 0;
    }
    if ((m >> 4) != 0x1) return -1;
    unsigned n = 1u << (m & 0x0F);
    if (n > 8 || off + 1 + n > doc->table) return -1;
    *out = (int64_t)be(doc->bytes + off + 1, n);
    return 0;
}

char **bp_string_array(const struct bp_doc *doc, size_t object, size_t *count) {
    size_t off = offset_of(doc, object), start;
    if (off == 0 || (doc->bytes[off] >> 4) != 0xA) return NULL;
    int64_t n = count_at(doc, off, &start);
    if (n < 0 || (size_t)n > (doc->table - start) / doc->ref_size) return NULL;
    char **out = calloc((size_t)n + 1, sizeof(char *));
    if (out == NULL) return NULL;
    for (size_t i = 0; i < (size_t)n; i++) {
        size_t r = ref_at(doc, start, i);
        if (r == (size_t)-1 || (out[i] = bp_string(doc, r)) == NULL) return NULL;
    }
    *count = (size_t)n;
    return out;
}

size_t bp_lookup(const struct bp_doc *doc, const char *key) {
    size_t off = offset_of(doc, doc->top), start;
    if (off == 0 || (doc->bytes[off] >> 4) != 0xD) return (size_t)-1;
    int64_t n = count_at(doc, off, &start);
    if (n < 0 || (size_t)n > (doc->table - start) / (2 * doc->ref_size)) return (size_t)-1;
    for (size_t i = 0; i < (size_t)n; i++) {
        size_t k = ref_at(doc, start, i);
        if (k == (size_t)-1) return (size_t)-1;
        char *name = bp_string(doc, k);
        int match = name != NULL && strcmp(name, key) == 0;
        free(name);
        if (match) return ref_at(doc, start, (size_t)n + i);
    }
    return (size_t)-1;
}

// MARK: Writer

struct writer {
    uint8_t *out;
    size_t capacity, used;
    uint16_t offsets[250];
    size_t objects;
};

static int put(struct writer *w, const void *bytes, size_t n) {
    if (w->used + n > w->capacity) return -1;
    memcpy(w->out + w->used, bytes, n);
    w->used += n;
    return 0;
}

static int put_marker(struct writer *w, uint8_t kind, size_t count) {
    if (count < 15) {
        uint8_t m = (uint8_t)(kind << 4 | count);
        return put(w, &m, 1);
    }
    uint8_t m[4] = {(uint8_t)(kind << 4 | 0x0F), 0x11, (uint8_t)(count >> 8), (uint8_t)count};
    return count > 0xFFFF ? -1 : put(w, m, 4);
}

/// Starts an object: records its offset (relative to the payload, after the frame header).
static int begin_object(struct writer *w) {
    if (w->objects >= 250 || w->used - 4 > 0xFFFF) return -1;
    w->offsets[w->objects++] = (uint16_t)(w->used - 4);
    return 0;
}

static int put_string(struct writer *w, const char *s) {
    size_t n = strlen(s);
    if (n > 4000) n = 4000;
    if (begin_object(w) != 0 || put_marker(w, 0x5, n) != 0 || w->used + n > w->capacity) return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        w->out[w->used++] = c >= 0x20 && c < 0x7F ? c : '?';
    }
    return 0;
}

size_t bp_write_frame(const struct bp_entry *entries, size_t count, uint8_t *out, size_t capacity) {
    struct writer w = {.out = out, .capacity = capacity, .used = 0, .objects = 0};
    if (put(&w, "\0\0\0\0bplist00", 12) != 0) return 0;
    // Object numbering: 0 the dictionary, then keys 1...count, then each value (and an array's strings).
    size_t values[32];
    if (count > 32) return 0;
    size_t next = 1 + count;
    for (size_t i = 0; i < count; i++) {
        values[i] = next;
        next += 1 + (entries[i].string ? 0 : entries[i].count);
    }
    if (next > 250) return 0;
    if (begin_object(&w) != 0 || put_marker(&w, 0xD, count) != 0) return 0;
    for (size_t i = 0; i < count; i++) {
        uint8_t r = (uint8_t)(1 + i);
        if (put(&w, &r, 1) != 0) return 0;
    }
    for (size_t i = 0; i < count; i++) {
        uint8_t r = (uint8_t)values[i];
        if (put(&w, &r, 1) != 0) return 0;
    }
    for (size_t i = 0; i < count; i++)
        if (put_string(&w, entries[i].key) != 0) return 0;
    for (size_t i = 0; i < count; i++) {
        if (entries[i].string) {
            if (put_string(&w, entries[i].string) != 0) return 0;
            continue;
        }
        if (begin_object(&w) != 0 || put_marker(&w, 0xA, entries[i].count) != 0) return 0;
        for (size_t j = 0; j < entries[i].count; j++) {
            uint8_t r = (uint8_t)(values[i] + 1 + j);
            if (put(&w, &r, 1) != 0) return 0;
        }
        for (size_t j = 0; j < entries[i].count; j++)
            if (put_string(&w, entries[i].strings[j]) != 0) return 0;
    }
    size_t table = w.used - 4;
    if (table > 0xFFFF) return 0;
    for (size_t i = 0; i < w.objects; i++) {
        uint8_t o[2] = {(uint8_t)(w.offsets[i] >> 8), (uint8_t)w.offsets[i]};
        if (put(&w, o, 2) != 0) return 0;
    }
    uint8_t trailer[32] = {0};
    trailer[6] = 2;  // offset size
    trailer[7] = 1;  // ref size
    trailer[15] = (uint8_t)w.objects;
    trailer[23] = 0;  // top object
    trailer[30] = (uint8_t)(table >> 8);
    trailer[31] = (uint8_t)table;
    if (put(&w, trailer, 32) != 0) return 0;
    size_t length = w.used - 4;
    out[0] = (uint8_t)(length >> 24);
    out[1] = (uint8_t)(length >> 16);
    out[2] = (uint8_t)(length >> 8);
    out[3] = (uint8_t)length;
    return w.used;
}
