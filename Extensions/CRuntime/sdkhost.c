/* sdkhost.c: the C runtime for sdk-host extensions, a port of Sources/SDKExtension (WorkerRuntime.swift,
 * ExtensionContext.swift, HostCalls.swift) with its own bplist00 codec. The API is documented in sdkhost.h,
 * the wire in docs/PROTOCOL.md, the use in docs/C-RUNTIME.md.
 *
 * Threads: the thread that calls sdkhost_run() is the reader. It owns the socket's input: it answers pings
 * itself (so a handler that blocks never looks hung), starts each request's handler on a thread of its own,
 * and delivers cancels, credit and host-call answers. Any thread writes: each frame is encoded apart, then
 * written whole under one lock. User callbacks never run under an internal lock.
 *
 * Lock order (outer first): lingering -> request.lock; registry -> request.lock; request.send_lock ->
 * request.lock; request.send_lock -> write lock. The host-call lock is a leaf. */
#define _GNU_SOURCE
#include "sdkhost.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define PROTOCOL_VERSION 2
#define MAX_DEPTH 512
#define MAX_OBJECTS (4u << 20)
/* The host's decoded-size budget (WireLimits): 64 times the payload plus 64 KiB, at most 128 MiB. This decoder
 * charges a value 16 bytes and its bytes, no more than the host charges it, so whatever the host (or a daemon
 * forwarding a client's frame unread) accepts, this accepts too. */
#define MAX_DECODED_BYTES ((int64_t)128 << 20)
#define DECODE_EXPANSION 64
#define DECODE_VALUE_COST 16
#define READ_CHUNK (64 * 1024)
#define RETAINED_BUFFER (256 * 1024)
#define MFD_NOEXEC_SEAL_FLAG 0x0008U

/* MARK: Logging and memory */

static pid_t g_pid;

static void log_text(const char *text) {
    char line[1200];
    int n = snprintf(line, sizeof line, "sdk-extension[%d]: %s\n", (int)(g_pid ? g_pid : getpid()), text);
    if (n < 0) return;
    size_t length = (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
    if (length > 0 && line[length - 1] != '\n') line[length - 1] = '\n';
    ssize_t unused = write(2, line, length);
    (void)unused;
}

void sdkhost_log(const char *format, ...) {
    char text[1024];
    va_list args;
    va_start(args, format);
    vsnprintf(text, sizeof text, format, args);
    va_end(args);
    log_text(text);
}

/* Text from the host (a type name, an error message) made fit for one log line: at most 120 bytes, controls
 * replaced. */
static const char *printable(const char *in, size_t length, char out[128]) {
    size_t n = 0;
    for (size_t i = 0; i < length && n < 120; i++) {
        unsigned char c = (unsigned char)in[i];
        out[n++] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    if (n < length) { out[n++] = '.'; out[n++] = '.'; }
    out[n] = 0;
    return out;
}

static _Noreturn void out_of_memory(void) {
    log_text("out of memory");
    abort();
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (p == NULL) out_of_memory();
    return p;
}

static void *xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (p == NULL) out_of_memory();
    return p;
}

/* realloc to count * size bytes, overflow-checked. */
static void *xrealloc_array(void *p, size_t count, size_t size) {
    if (size != 0 && count > SIZE_MAX / size) out_of_memory();
    size_t bytes = count * size;
    void *q = realloc(p, bytes ? bytes : 1);
    if (q == NULL) out_of_memory();
    return q;
}

static char *dup_bytes(const char *s, size_t n) {
    if (n == SIZE_MAX) out_of_memory();
    char *p = xmalloc(n + 1);
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

static uint64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* MARK: Values */

sdkhost_value sdkhost_string_n(const char *s, size_t length) {
    sdkhost_value v = {.kind = SDKHOST_STRING};
    v.u.string.bytes = dup_bytes(s ? s : "", s ? length : 0);
    v.u.string.length = s ? length : 0;
    return v;
}

sdkhost_value sdkhost_string(const char *s) { return sdkhost_string_n(s, s ? strlen(s) : 0); }

sdkhost_value sdkhost_integer(int64_t i) {
    sdkhost_value v = {.kind = SDKHOST_INTEGER};
    v.u.integer = i;
    return v;
}

sdkhost_value sdkhost_real(double d) {
    sdkhost_value v = {.kind = SDKHOST_REAL};
    v.u.real = d;
    return v;
}

sdkhost_value sdkhost_bool(bool b) {
    sdkhost_value v = {.kind = SDKHOST_BOOL};
    v.u.boolean = b;
    return v;
}

sdkhost_value sdkhost_date(double seconds) {
    sdkhost_value v = {.kind = SDKHOST_DATE};
    v.u.date = seconds;
    return v;
}

sdkhost_value sdkhost_data(const void *bytes, size_t length) {
    sdkhost_value v = {.kind = SDKHOST_DATA};
    if (length > 0 && bytes != NULL) {
        v.u.data.bytes = xmalloc(length);
        memcpy(v.u.data.bytes, bytes, length);
        v.u.data.length = length;
    }
    return v;
}

sdkhost_value sdkhost_array(void) {
    sdkhost_value v = {.kind = SDKHOST_ARRAY};
    return v;
}

sdkhost_value sdkhost_dictionary(void) {
    sdkhost_value v = {.kind = SDKHOST_DICTIONARY};
    return v;
}

int sdkhost_array_append(sdkhost_value *array, sdkhost_value element) {
    if (array == NULL || array->kind != SDKHOST_ARRAY) {
        sdkhost_value_free(&element);
        return -1;
    }
    if (array->u.array.count == array->u.array.capacity) {
        size_t capacity = array->u.array.capacity ? array->u.array.capacity * 2 : 4;
        array->u.array.elements = xrealloc_array(array->u.array.elements, capacity, sizeof(sdkhost_value));
        array->u.array.capacity = capacity;
    }
    array->u.array.elements[array->u.array.count++] = element;
    return 0;
}

static sdkhost_entry *find_entry(const sdkhost_value *dictionary, const char *key, size_t key_length) {
    if (dictionary == NULL || dictionary->kind != SDKHOST_DICTIONARY) return NULL;
    for (size_t i = 0; i < dictionary->u.dictionary.count; i++) {
        sdkhost_entry *e = &dictionary->u.dictionary.entries[i];
        if (e->key_length == key_length && memcmp(e->key, key, key_length) == 0) return e;
    }
    return NULL;
}

int sdkhost_dictionary_set_n(sdkhost_value *dictionary, const char *key, size_t key_length, sdkhost_value value) {
    if (dictionary == NULL || dictionary->kind != SDKHOST_DICTIONARY || key == NULL) {
        sdkhost_value_free(&value);
        return -1;
    }
    sdkhost_entry *existing = find_entry(dictionary, key, key_length);
    if (existing != NULL) {
        sdkhost_value_free(&existing->value);
        existing->value = value;
        return 0;
    }
    if (dictionary->u.dictionary.count == dictionary->u.dictionary.capacity) {
        size_t capacity = dictionary->u.dictionary.capacity ? dictionary->u.dictionary.capacity * 2 : 4;
        dictionary->u.dictionary.entries = xrealloc_array(dictionary->u.dictionary.entries, capacity, sizeof(sdkhost_entry));
        dictionary->u.dictionary.capacity = capacity;
    }
    sdkhost_entry *e = &dictionary->u.dictionary.entries[dictionary->u.dictionary.count++];
    e->key = dup_bytes(key, key_length);
    e->key_length = key_length;
    e->value = value;
    return 0;
}

int sdkhost_dictionary_set(sdkhost_value *dictionary, const char *key, sdkhost_value value) {
    return sdkhost_dictionary_set_n(dictionary, key, key ? strlen(key) : 0, value);
}

const sdkhost_value *sdkhost_dictionary_get(const sdkhost_value *dictionary, const char *key) {
    if (key == NULL) return NULL;
    sdkhost_entry *e = find_entry(dictionary, key, strlen(key));
    return e ? &e->value : NULL;
}

const char *sdkhost_value_string(const sdkhost_value *value) {
    return value != NULL && value->kind == SDKHOST_STRING ? value->u.string.bytes : NULL;
}

sdkhost_value sdkhost_value_copy(const sdkhost_value *value) {
    sdkhost_value v = {.kind = SDKHOST_NONE};
    if (value == NULL) return v;
    switch (value->kind) {
    case SDKHOST_STRING: return sdkhost_string_n(value->u.string.bytes, value->u.string.length);
    case SDKHOST_DATA: return sdkhost_data(value->u.data.bytes, value->u.data.length);
    case SDKHOST_ARRAY:
        v.kind = SDKHOST_ARRAY;
        if (value->u.array.count > 0) {
            v.u.array.elements = xrealloc_array(NULL, value->u.array.count, sizeof(sdkhost_value));
            for (size_t i = 0; i < value->u.array.count; i++)
                v.u.array.elements[i] = sdkhost_value_copy(&value->u.array.elements[i]);
            v.u.array.count = v.u.array.capacity = value->u.array.count;
        }
        return v;
    case SDKHOST_DICTIONARY:
        v.kind = SDKHOST_DICTIONARY;
        if (value->u.dictionary.count > 0) {
            v.u.dictionary.entries = xrealloc_array(NULL, value->u.dictionary.count, sizeof(sdkhost_entry));
            for (size_t i = 0; i < value->u.dictionary.count; i++) {
                const sdkhost_entry *e = &value->u.dictionary.entries[i];
                v.u.dictionary.entries[i].key = dup_bytes(e->key, e->key_length);
                v.u.dictionary.entries[i].key_length = e->key_length;
                v.u.dictionary.entries[i].value = sdkhost_value_copy(&e->value);
            }
            v.u.dictionary.count = v.u.dictionary.capacity = value->u.dictionary.count;
        }
        return v;
    default: return *value;  /* scalars */
    }
}

bool sdkhost_value_equal(const sdkhost_value *a, const sdkhost_value *b) {
    if (a == NULL || b == NULL) return a == b;
    if (a->kind != b->kind) return false;
    switch (a->kind) {
    case SDKHOST_NONE: return true;
    case SDKHOST_STRING:
        return a->u.string.length == b->u.string.length
            && memcmp(a->u.string.bytes, b->u.string.bytes, a->u.string.length) == 0;
    case SDKHOST_INTEGER: return a->u.integer == b->u.integer;
    case SDKHOST_REAL: return a->u.real == b->u.real || (isnan(a->u.real) && isnan(b->u.real));
    case SDKHOST_DATE: return a->u.date == b->u.date || (isnan(a->u.date) && isnan(b->u.date));
    case SDKHOST_BOOL: return a->u.boolean == b->u.boolean;
    case SDKHOST_DATA:
        return a->u.data.length == b->u.data.length
            && (a->u.data.length == 0 || memcmp(a->u.data.bytes, b->u.data.bytes, a->u.data.length) == 0);
    case SDKHOST_ARRAY:
        if (a->u.array.count != b->u.array.count) return false;
        for (size_t i = 0; i < a->u.array.count; i++)
            if (!sdkhost_value_equal(&a->u.array.elements[i], &b->u.array.elements[i])) return false;
        return true;
    case SDKHOST_DICTIONARY:
        if (a->u.dictionary.count != b->u.dictionary.count) return false;
        for (size_t i = 0; i < a->u.dictionary.count; i++) {
            const sdkhost_entry *e = &a->u.dictionary.entries[i];
            const sdkhost_entry *f = find_entry(b, e->key, e->key_length);
            if (f == NULL || !sdkhost_value_equal(&e->value, &f->value)) return false;
        }
        return true;
    }
    return false;
}

void sdkhost_value_free(sdkhost_value *value) {
    if (value == NULL) return;
    switch (value->kind) {
    case SDKHOST_STRING: free(value->u.string.bytes); break;
    case SDKHOST_DATA: free(value->u.data.bytes); break;
    case SDKHOST_ARRAY:
        for (size_t i = 0; i < value->u.array.count; i++) sdkhost_value_free(&value->u.array.elements[i]);
        free(value->u.array.elements);
        break;
    case SDKHOST_DICTIONARY:
        for (size_t i = 0; i < value->u.dictionary.count; i++) {
            free(value->u.dictionary.entries[i].key);
            sdkhost_value_free(&value->u.dictionary.entries[i].value);
        }
        free(value->u.dictionary.entries);
        break;
    default: break;
    }
    memset(value, 0, sizeof *value);
}

/* MARK: Items */

sdkhost_item sdkhost_item_make(const char *title, const char *text) {
    sdkhost_item item;
    memset(&item, 0, sizeof item);
    item.attachments = sdkhost_array();
    item.user_info = sdkhost_dictionary();
    sdkhost_item_set_title(&item, title);
    sdkhost_item_set_text(&item, text);
    return item;
}

void sdkhost_item_set_title(sdkhost_item *item, const char *title) {
    free(item->title);
    item->title = title ? dup_bytes(title, strlen(title)) : NULL;
    item->title_length = title ? strlen(title) : 0;
}

void sdkhost_item_set_text(sdkhost_item *item, const char *text) {
    free(item->text);
    item->text = text ? dup_bytes(text, strlen(text)) : NULL;
    item->text_length = text ? strlen(text) : 0;
}

void sdkhost_item_add_attachment(sdkhost_item *item, sdkhost_value value) {
    if (item->attachments.kind == SDKHOST_NONE) item->attachments = sdkhost_array();
    sdkhost_array_append(&item->attachments, value);
}

void sdkhost_item_set_user_info(sdkhost_item *item, const char *key, sdkhost_value value) {
    if (item->user_info.kind == SDKHOST_NONE) item->user_info = sdkhost_dictionary();
    sdkhost_dictionary_set(&item->user_info, key, value);
}

void sdkhost_item_add_file(sdkhost_item *item, int fd) {
    if (item->file_count == item->file_capacity) {
        size_t capacity = item->file_capacity ? item->file_capacity * 2 : 4;
        item->files = xrealloc_array(item->files, capacity, sizeof(int));
        item->file_capacity = capacity;
    }
    item->files[item->file_count++] = fd;
}

int sdkhost_item_copy(const sdkhost_item *item, sdkhost_item *copy) {
    memset(copy, 0, sizeof *copy);
    for (size_t i = 0; i < item->file_count; i++) {
        int fd = fcntl(item->files[i], F_DUPFD_CLOEXEC, 0);
        if (fd < 0) {
            int e = errno;
            sdkhost_item_free(copy);
            return e;
        }
        sdkhost_item_add_file(copy, fd);
    }
    copy->title = item->title ? dup_bytes(item->title, item->title_length) : NULL;
    copy->title_length = item->title ? item->title_length : 0;
    copy->text = item->text ? dup_bytes(item->text, item->text_length) : NULL;
    copy->text_length = item->text ? item->text_length : 0;
    copy->attachments = item->attachments.kind == SDKHOST_ARRAY ? sdkhost_value_copy(&item->attachments) : sdkhost_array();
    copy->user_info = item->user_info.kind == SDKHOST_DICTIONARY ? sdkhost_value_copy(&item->user_info) : sdkhost_dictionary();
    return 0;
}

void sdkhost_item_free(sdkhost_item *item) {
    if (item == NULL) return;
    free(item->title);
    free(item->text);
    sdkhost_value_free(&item->attachments);
    sdkhost_value_free(&item->user_info);
    for (size_t i = 0; i < item->file_count; i++)
        if (item->files[i] >= 0) close(item->files[i]);
    free(item->files);
    memset(item, 0, sizeof *item);
}

void sdkhost_items_free(sdkhost_item *items, size_t count) {
    if (items == NULL) return;
    for (size_t i = 0; i < count; i++) sdkhost_item_free(&items[i]);
    free(items);
}

/* MARK: Encoder
 *
 * Two passes, as the Swift encoder: the first counts objects, references and bytes, which fixes the reference
 * and offset widths and so the payload's exact size (a frame over the limit is refused before anything is
 * allocated); the second stores every object in place. A container reserves consecutive indices for its
 * children. Strings are ASCII when they can be, else UTF-16BE (invalid UTF-8 becomes U+FFFD). */

typedef struct plan {
    size_t objects, references, bytes;
    int error;
} plan;

static int byte_width(uint64_t v) { return v <= 0xFF ? 1 : v <= 0xFFFF ? 2 : v <= 0xFFFFFFFFu ? 4 : 8; }

static size_t header_size(size_t count) { return count < 15 ? 1 : 2 + (size_t)byte_width(count); }

static void plan_add(plan *p, size_t *field, size_t amount) {
    if (amount > SIZE_MAX / 4 - *field) p->error = EOVERFLOW;
    else *field += amount;
}

/* The next code point of UTF-8 at s[*i] (n bytes in all), advancing *i; an invalid sequence is one U+FFFD per
 * byte. Both passes use it, so they agree. */
static uint32_t utf8_next(const uint8_t *s, size_t n, size_t *i) {
    uint8_t c = s[*i];
    if (c < 0x80) { (*i)++; return c; }
    size_t need;
    uint32_t cp;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) { need = 1; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2; cp = c & 0x0F;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3; cp = c & 0x07;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else { (*i)++; return 0xFFFD; }
    if (n - *i <= need) { (*i)++; return 0xFFFD; }
    for (size_t k = 1; k <= need; k++) {
        uint8_t d = s[*i + k];
        if (k == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF)) { (*i)++; return 0xFFFD; }
        cp = (cp << 6) | (d & 0x3F);
    }
    *i += need + 1;
    return cp;
}

static bool is_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return false;
    return true;
}

static size_t utf16_units(const char *s, size_t n) {
    size_t units = 0, i = 0;
    while (i < n) units += utf8_next((const uint8_t *)s, n, &i) >= 0x10000 ? 2 : 1;
    return units;
}

static void plan_string(plan *p, const char *s, size_t n) {
    p->objects++;
    if (is_ascii(s, n)) {
        plan_add(p, &p->bytes, header_size(n));
        plan_add(p, &p->bytes, n);
    } else {
        size_t units = utf16_units(s, n);
        plan_add(p, &p->bytes, header_size(units));
        plan_add(p, &p->bytes, units);
        plan_add(p, &p->bytes, units);
    }
}

static void plan_value(plan *p, const sdkhost_value *v, int depth) {
    if (p->error) return;
    switch (v->kind) {
    case SDKHOST_BOOL: p->objects++; plan_add(p, &p->bytes, 1); break;
    case SDKHOST_INTEGER:
        p->objects++;
        plan_add(p, &p->bytes, v->u.integer < 0 ? 9 : 1 + (size_t)byte_width((uint64_t)v->u.integer));
        break;
    case SDKHOST_REAL: case SDKHOST_DATE: p->objects++; plan_add(p, &p->bytes, 9); break;
    case SDKHOST_DATA:
        p->objects++;
        plan_add(p, &p->bytes, header_size(v->u.data.length));
        plan_add(p, &p->bytes, v->u.data.length);
        break;
    case SDKHOST_STRING: plan_string(p, v->u.string.bytes, v->u.string.length); break;
    case SDKHOST_ARRAY:
        if (depth >= MAX_DEPTH) { p->error = EINVAL; return; }
        p->objects++;
        plan_add(p, &p->bytes, header_size(v->u.array.count));
        plan_add(p, &p->references, v->u.array.count);
        for (size_t i = 0; i < v->u.array.count && !p->error; i++) plan_value(p, &v->u.array.elements[i], depth + 1);
        break;
    case SDKHOST_DICTIONARY:
        if (depth >= MAX_DEPTH) { p->error = EINVAL; return; }
        p->objects++;
        plan_add(p, &p->bytes, header_size(v->u.dictionary.count));
        plan_add(p, &p->references, v->u.dictionary.count);
        plan_add(p, &p->references, v->u.dictionary.count);
        for (size_t i = 0; i < v->u.dictionary.count && !p->error; i++) {
            const sdkhost_entry *e = &v->u.dictionary.entries[i];
            plan_string(p, e->key, e->key_length);
            plan_value(p, &e->value, depth + 1);
        }
        break;
    default: p->error = EINVAL; break;
    }
}

typedef struct layout {
    int ref_size, offset_size;
    size_t table_offset, total;
} layout;

static int layout_of(const plan *p, layout *l) {
    if (p->error) return p->error;
    l->ref_size = byte_width(p->objects);
    /* Each term is below SIZE_MAX / 4 (plan_add), so these sums cannot wrap. */
    if (p->references > (SIZE_MAX / 4) / 8) return EOVERFLOW;
    l->table_offset = 8 + p->bytes + p->references * (size_t)l->ref_size;
    l->offset_size = byte_width(l->table_offset);
    if (p->objects > (SIZE_MAX / 4) / 8) return EOVERFLOW;
    l->total = l->table_offset + p->objects * (size_t)l->offset_size + 32;
    return 0;
}

typedef struct writer {
    uint8_t *base, *table;
    size_t cursor, next;
    int ref_size, offset_size;
} writer;

static void store_be(uint8_t *p, uint64_t v, int size) {
    for (int i = size - 1; i >= 0; i--) {
        p[i] = (uint8_t)v;
        v >>= 8;
    }
}

static void w_put(writer *w, uint8_t byte) { w->base[w->cursor++] = byte; }

static void w_be(writer *w, uint64_t v, int size) {
    store_be(w->base + w->cursor, v, size);
    w->cursor += (size_t)size;
}

static void w_offset(writer *w, size_t index) {
    store_be(w->table + index * (size_t)w->offset_size, w->cursor, w->offset_size);
}

static void w_integer(writer *w, int64_t i) {
    if (i < 0) {
        w_put(w, 0x13);
        w_be(w, (uint64_t)i, 8);
        return;
    }
    int width = byte_width((uint64_t)i);
    w_put(w, (uint8_t)(0x10 | (width == 1 ? 0 : width == 2 ? 1 : width == 4 ? 2 : 3)));
    w_be(w, (uint64_t)i, width);
}

static void w_header(writer *w, uint8_t marker, size_t count) {
    if (count < 15) {
        w_put(w, (uint8_t)(marker | count));
    } else {
        w_put(w, (uint8_t)(marker | 0x0F));
        w_integer(w, (int64_t)count);
    }
}

static void w_string(writer *w, const char *s, size_t n) {
    if (is_ascii(s, n)) {
        w_header(w, 0x50, n);
        if (n) memcpy(w->base + w->cursor, s, n);
        w->cursor += n;
        return;
    }
    w_header(w, 0x60, utf16_units(s, n));
    size_t i = 0;
    while (i < n) {
        uint32_t cp = utf8_next((const uint8_t *)s, n, &i);
        if (cp >= 0x10000) {
            cp -= 0x10000;
            w_be(w, 0xD800 | (cp >> 10), 2);
            w_be(w, 0xDC00 | (cp & 0x3FF), 2);
        } else {
            w_be(w, cp, 2);
        }
    }
}

static void w_value(writer *w, const sdkhost_value *v, size_t index) {
    w_offset(w, index);
    switch (v->kind) {
    case SDKHOST_BOOL: w_put(w, v->u.boolean ? 0x09 : 0x08); break;
    case SDKHOST_INTEGER: w_integer(w, v->u.integer); break;
    case SDKHOST_REAL: case SDKHOST_DATE: {
        uint64_t bits;
        double d = v->kind == SDKHOST_REAL ? v->u.real : v->u.date;
        memcpy(&bits, &d, 8);
        w_put(w, v->kind == SDKHOST_REAL ? 0x23 : 0x33);
        w_be(w, bits, 8);
        break;
    }
    case SDKHOST_DATA:
        w_header(w, 0x40, v->u.data.length);
        if (v->u.data.length) memcpy(w->base + w->cursor, v->u.data.bytes, v->u.data.length);
        w->cursor += v->u.data.length;
        break;
    case SDKHOST_STRING: w_string(w, v->u.string.bytes, v->u.string.length); break;
    case SDKHOST_ARRAY: {
        size_t n = v->u.array.count, first = w->next;
        w->next += n;
        w_header(w, 0xA0, n);
        for (size_t i = 0; i < n; i++) w_be(w, first + i, w->ref_size);
        for (size_t i = 0; i < n; i++) w_value(w, &v->u.array.elements[i], first + i);
        break;
    }
    case SDKHOST_DICTIONARY: {
        size_t n = v->u.dictionary.count, first = w->next;
        w->next += 2 * n;
        w_header(w, 0xD0, n);
        for (size_t i = 0; i < 2 * n; i++) w_be(w, first + i, w->ref_size);
        for (size_t i = 0; i < n; i++) {
            w_offset(w, first + i);
            w_string(w, v->u.dictionary.entries[i].key, v->u.dictionary.entries[i].key_length);
        }
        for (size_t i = 0; i < n; i++) w_value(w, &v->u.dictionary.entries[i].value, first + n + i);
        break;
    }
    default: break;  /* refused by plan_value */
    }
}

/* Writes the payload planned as `p`/`l` for `value` at `out` (l->total bytes). */
static void write_payload(const sdkhost_value *value, const plan *p, const layout *l, uint8_t *out) {
    writer w = {.base = out, .table = out + l->table_offset, .cursor = 0, .next = 1,
                .ref_size = l->ref_size, .offset_size = l->offset_size};
    memcpy(out, "bplist00", 8);
    w.cursor = 8;
    w_value(&w, value, 0);
    if (w.cursor != l->table_offset || w.next != p->objects) {
        log_text("bplist encoder: the size pass and the write pass disagree");
        abort();
    }
    uint8_t *trailer = out + l->table_offset + p->objects * (size_t)l->offset_size;
    memset(trailer, 0, 32);
    trailer[6] = (uint8_t)l->offset_size;
    trailer[7] = (uint8_t)l->ref_size;
    store_be(trailer + 8, p->objects, 8);
    store_be(trailer + 24, l->table_offset, 8);
}

int sdkhost_plist_encode(const sdkhost_value *value, uint8_t **payload, size_t *length) {
    plan p = {0};
    layout l;
    if (value == NULL) return EINVAL;
    plan_value(&p, value, 0);
    int e = layout_of(&p, &l);
    if (e) return e;
    uint8_t *out = xmalloc(l.total);
    write_payload(value, &p, &l, out);
    *payload = out;
    *length = l.total;
    return 0;
}

/* A frame for `value`; on EMSGSIZE `detail` says by how much. */
static int frame_encode(const sdkhost_value *value, uint8_t **frame, size_t *length, char *detail, size_t detail_size) {
    plan p = {0};
    layout l;
    plan_value(&p, value, 0);
    int e = layout_of(&p, &l);
    if (e) {
        if (detail) snprintf(detail, detail_size, "%s", e == EINVAL ? "a value is none, or nested deeper than 512" : "too large to encode");
        return e;
    }
    if (l.total > SDKHOST_MAX_FRAME_BYTES) {
        if (detail) snprintf(detail, detail_size, "frame payload of %zu bytes exceeds the limit of %u", l.total, SDKHOST_MAX_FRAME_BYTES);
        return EMSGSIZE;
    }
    uint8_t *out = xmalloc(l.total + 4);
    store_be(out, l.total, 4);
    write_payload(value, &p, &l, out + 4);
    *frame = out;
    *length = l.total + 4;
    return 0;
}

int sdkhost_frame_encode(const sdkhost_value *value, uint8_t **frame, size_t *length) {
    if (value == NULL) return EINVAL;
    return frame_encode(value, frame, length, NULL, 0);
}

/* MARK: Decoder
 *
 * A port of BinaryPlistDecoder.swift: every size read from the input is checked against the bytes present before
 * it is used; a node budget and a byte budget (each value charged, in proportion to the payload) stop shared
 * objects from expanding a small payload; an on-path flag per object catches cycles. */

typedef struct reader {
    const uint8_t *base;
    size_t size, count, top, objects_end;
    int offset_size, ref_size;
    int64_t budget, byte_budget;
    uint8_t *on_path;
    char *why;
    size_t why_size;
} reader;

static int fail(reader *r, const char *format, ...) SDKHOST_PRINTF(2, 3);
static int fail(reader *r, const char *format, ...) {
    if (r->why && r->why_size) {
        va_list args;
        va_start(args, format);
        vsnprintf(r->why, r->why_size, format, args);
        va_end(args);
    }
    return -1;
}

static uint64_t read_be(const uint8_t *p, int size) {
    uint64_t v = 0;
    for (int i = 0; i < size; i++) v = (v << 8) | p[i];
    return v;
}

static int charge(reader *r, int64_t bytes, size_t object) {
    r->byte_budget -= bytes;
    if (r->byte_budget < 0)
        return fail(r, "tooManyObjects: object %zu: payload expands past its decoded-size budget", object);
    return 0;
}

static int require(reader *r, size_t start, size_t length, size_t object) {
    if (start > r->objects_end || length > r->objects_end - start)
        return fail(r, "offsetOutOfRange: object %zu needs %zu bytes at %zu, past the object area end %zu", object,
                    length, start, r->objects_end);
    return 0;
}

static int object_offset(reader *r, size_t object, size_t *offset) {
    uint64_t raw = read_be(r->base + r->objects_end + object * (size_t)r->offset_size, r->offset_size);
    if (raw < 8 || raw >= r->objects_end)
        return fail(r, "offsetOutOfRange: object %zu has offset %llu outside 8..<%zu", object, (unsigned long long)raw,
                    r->objects_end);
    *offset = (size_t)raw;
    return 0;
}

static int object_ref(reader *r, size_t position, size_t *object) {
    uint64_t ref = read_be(r->base + position, r->ref_size);
    if (ref >= r->count)
        return fail(r, "objectRefOutOfRange: reference %llu at byte %zu >= object count %zu", (unsigned long long)ref,
                    position, r->count);
    *object = (size_t)ref;
    return 0;
}

static int element_count(reader *r, uint8_t low, size_t offset, size_t object, size_t *count, size_t *start) {
    if (low != 0x0F) {
        *count = low;
        *start = offset + 1;
        return 0;
    }
    if (require(r, offset + 1, 1, object)) return -1;
    uint8_t marker = r->base[offset + 1];
    if (marker >> 4 != 0x1 || (marker & 0x0F) > 3)
        return fail(r, "invalidObject: object %zu: length marker 0x%02x is not an integer", object, marker);
    int size = 1 << (marker & 0x0F);
    if (require(r, offset + 2, (size_t)size, object)) return -1;
    uint64_t n = read_be(r->base + offset + 2, size);
    if (n > r->objects_end) return fail(r, "offsetOutOfRange: object %zu: length %llu exceeds the payload", object, (unsigned long long)n);
    *count = (size_t)n;
    *start = offset + 2 + (size_t)size;
    return 0;
}

static int enter(reader *r, size_t object, int depth) {
    if (depth >= MAX_DEPTH) return fail(r, "tooDeep: object %zu: nesting deeper than the limit of %d", object, MAX_DEPTH);
    if (r->on_path[object]) return fail(r, "cycle: object %zu contains itself (at depth %d)", object, depth);
    r->on_path[object] = 1;
    return 0;
}

/* UTF-16BE (units at `start`) to UTF-8; unpaired surrogates become U+FFFD, as Swift's String(decoding:) does. */
static char *utf16_to_utf8(const uint8_t *p, size_t units, size_t *length) {
    if (units > (SIZE_MAX - 1) / 3) out_of_memory();
    char *out = xmalloc(units * 3 + 1);
    size_t n = 0;
    for (size_t i = 0; i < units; i++) {
        uint32_t u = (uint32_t)p[2 * i] << 8 | p[2 * i + 1];
        if (u >= 0xD800 && u <= 0xDBFF && i + 1 < units) {
            uint32_t v = (uint32_t)p[2 * i + 2] << 8 | p[2 * i + 3];
            if (v >= 0xDC00 && v <= 0xDFFF) {
                u = 0x10000 + ((u - 0xD800) << 10) + (v - 0xDC00);
                i++;
            }
        }
        if (u >= 0xD800 && u <= 0xDFFF) u = 0xFFFD;
        if (u < 0x80) {
            out[n++] = (char)u;
        } else if (u < 0x800) {
            out[n++] = (char)(0xC0 | (u >> 6));
            out[n++] = (char)(0x80 | (u & 0x3F));
        } else if (u < 0x10000) {
            out[n++] = (char)(0xE0 | (u >> 12));
            out[n++] = (char)(0x80 | ((u >> 6) & 0x3F));
            out[n++] = (char)(0x80 | (u & 0x3F));
        } else {
            out[n++] = (char)(0xF0 | (u >> 18));
            out[n++] = (char)(0x80 | ((u >> 12) & 0x3F));
            out[n++] = (char)(0x80 | ((u >> 6) & 0x3F));
            out[n++] = (char)(0x80 | (u & 0x3F));
        }
    }
    out[n] = 0;
    *length = n;
    return out;
}

typedef struct key_index {
    const sdkhost_entry *entry;
    size_t position;
} key_index;

static int compare_keys(const void *a, const void *b) {
    const key_index *x = a, *y = b;
    size_t n = x->entry->key_length < y->entry->key_length ? x->entry->key_length : y->entry->key_length;
    int c = memcmp(x->entry->key, y->entry->key, n);
    if (c) return c;
    if (x->entry->key_length != y->entry->key_length) return x->entry->key_length < y->entry->key_length ? -1 : 1;
    return x->position < y->position ? -1 : x->position > y->position;
}

/* A dictionary that names a key twice keeps the last value, as the host's decoder does. */
static void drop_duplicate_keys(sdkhost_value *d) {
    size_t n = d->u.dictionary.count;
    if (n < 2) return;
    sdkhost_entry *entries = d->u.dictionary.entries;
    key_index *index = xrealloc_array(NULL, n, sizeof(key_index));
    for (size_t i = 0; i < n; i++) index[i] = (key_index){&entries[i], i};
    qsort(index, n, sizeof(key_index), compare_keys);
    uint8_t *dropped = xcalloc(n, 1);
    bool any = false;
    for (size_t i = 0; i + 1 < n; i++) {
        if (index[i].entry->key_length == index[i + 1].entry->key_length
            && memcmp(index[i].entry->key, index[i + 1].entry->key, index[i].entry->key_length) == 0) {
            dropped[index[i].position] = 1;
            any = true;
        }
    }
    if (any) {
        size_t kept = 0;
        for (size_t i = 0; i < n; i++) {
            if (dropped[i]) {
                free(entries[i].key);
                sdkhost_value_free(&entries[i].value);
            } else {
                entries[kept++] = entries[i];
            }
        }
        d->u.dictionary.count = kept;
    }
    free(dropped);
    free(index);
}

static int decode_value(reader *r, size_t object, int depth, sdkhost_value *out) {
    memset(out, 0, sizeof *out);
    if (--r->budget < 0) return fail(r, "tooManyObjects: payload expands to more than the limit of values");
    if (charge(r, DECODE_VALUE_COST, object)) return -1;
    size_t off = 0;
    if (object_offset(r, object, &off)) return -1;
    uint8_t marker = r->base[off], low = marker & 0x0F;
    switch (marker >> 4) {
    case 0x0:
        if (low == 0x8 || low == 0x9) {
            out->kind = SDKHOST_BOOL;
            out->u.boolean = low == 0x9;
            return 0;
        }
        return fail(r, "unsupportedObject: object %zu: marker 0x%02x (null/fill)", object, marker);
    case 0x1: {
        if (low > 4) return fail(r, "invalidObject: object %zu: integer size nibble %u", object, low);
        int size = 1 << low;
        if (require(r, off + 1, (size_t)size, object)) return -1;
        out->kind = SDKHOST_INTEGER;
        if (size == 16) {
            uint64_t hi = read_be(r->base + off + 1, 8), lo = read_be(r->base + off + 9, 8);
            bool negative = (lo >> 63) != 0;
            if (!((hi == 0 && !negative) || (hi == UINT64_MAX && negative)))
                return fail(r, "integerOutOfRange: object %zu: 128-bit integer outside Int64", object);
            out->u.integer = (int64_t)lo;
        } else {
            out->u.integer = (int64_t)read_be(r->base + off + 1, size);  /* 1/2/4 unsigned; 8 two's complement */
        }
        return 0;
    }
    case 0x2:
        if (low == 2) {
            if (require(r, off + 1, 4, object)) return -1;
            uint32_t bits = (uint32_t)read_be(r->base + off + 1, 4);
            float f;
            memcpy(&f, &bits, 4);
            out->kind = SDKHOST_REAL;
            out->u.real = (double)f;
            return 0;
        }
        if (low == 3) {
            if (require(r, off + 1, 8, object)) return -1;
            uint64_t bits = read_be(r->base + off + 1, 8);
            out->kind = SDKHOST_REAL;
            memcpy(&out->u.real, &bits, 8);
            return 0;
        }
        return fail(r, "invalidObject: object %zu: real size nibble %u", object, low);
    case 0x3: {
        if (low != 3) return fail(r, "invalidObject: object %zu: date marker 0x%02x", object, marker);
        if (require(r, off + 1, 8, object)) return -1;
        uint64_t bits = read_be(r->base + off + 1, 8);
        out->kind = SDKHOST_DATE;
        memcpy(&out->u.date, &bits, 8);
        return 0;
    }
    case 0x4: case 0x5: {
        size_t n, start;
        if (element_count(r, low, off, object, &n, &start) || require(r, start, n, object)) return -1;
        if (charge(r, (int64_t)n, object)) return -1;
        if (marker >> 4 == 0x4) {
            *out = sdkhost_data(r->base + start, n);
            return 0;
        }
        for (size_t i = 0; i < n; i++)
            if (r->base[start + i] >= 0x80)
                return fail(r, "invalidObject: object %zu: byte 0x%02x in an ASCII string", object, r->base[start + i]);
        *out = sdkhost_string_n((const char *)r->base + start, n);
        return 0;
    }
    case 0x6: {
        size_t n, start;
        if (element_count(r, low, off, object, &n, &start)) return -1;
        if (start > r->objects_end || n > (r->objects_end - start) / 2)
            return fail(r, "offsetOutOfRange: object %zu: string of %zu UTF-16 units overruns the object area", object, n);
        if (charge(r, 3 * (int64_t)n, object)) return -1;
        out->kind = SDKHOST_STRING;
        out->u.string.bytes = utf16_to_utf8(r->base + start, n, &out->u.string.length);
        return 0;
    }
    case 0xA: {
        size_t n, start;
        if (element_count(r, low, off, object, &n, &start)) return -1;
        if (start > r->objects_end || n > (r->objects_end - start) / (size_t)r->ref_size)
            return fail(r, "offsetOutOfRange: object %zu: array of %zu references overruns the object area", object, n);
        if (enter(r, object, depth)) return -1;
        out->kind = SDKHOST_ARRAY;
        /* Room for what the budgets still allow, not what the count claims. */
        size_t room = n;
        if ((int64_t)room > r->budget) room = (size_t)(r->budget > 0 ? r->budget : 0);
        if ((int64_t)room > r->byte_budget / DECODE_VALUE_COST) room = (size_t)(r->byte_budget / DECODE_VALUE_COST);
        if (room > 0) {
            out->u.array.elements = xrealloc_array(NULL, room, sizeof(sdkhost_value));
            out->u.array.capacity = room;
        }
        for (size_t i = 0; i < n; i++) {
            size_t child = 0;
            sdkhost_value element;
            if (object_ref(r, start + i * (size_t)r->ref_size, &child)) return -1;
            if (decode_value(r, child, depth + 1, &element)) {
                sdkhost_value_free(&element);
                return -1;
            }
            sdkhost_array_append(out, element);
        }
        r->on_path[object] = 0;
        return 0;
    }
    case 0xD: {
        size_t n, start;
        if (element_count(r, low, off, object, &n, &start)) return -1;
        if (start > r->objects_end || n > (r->objects_end - start) / (2 * (size_t)r->ref_size))
            return fail(r, "offsetOutOfRange: object %zu: dictionary of %zu entries overruns the object area", object, n);
        if (enter(r, object, depth)) return -1;
        out->kind = SDKHOST_DICTIONARY;
        size_t room = n;
        if ((int64_t)room > r->budget / 2) room = (size_t)(r->budget > 0 ? r->budget / 2 : 0);
        if ((int64_t)room > r->byte_budget / (2 * DECODE_VALUE_COST)) room = (size_t)(r->byte_budget / (2 * DECODE_VALUE_COST));
        if (room > 0) {
            out->u.dictionary.entries = xrealloc_array(NULL, room, sizeof(sdkhost_entry));
            out->u.dictionary.capacity = room;
        }
        for (size_t i = 0; i < n; i++) {
            size_t key_object = 0, value_object = 0;
            sdkhost_value key, value = {.kind = SDKHOST_NONE};
            if (object_ref(r, start + i * (size_t)r->ref_size, &key_object)) return -1;
            if (decode_value(r, key_object, depth + 1, &key)) {
                sdkhost_value_free(&key);
                return -1;
            }
            if (key.kind != SDKHOST_STRING) {
                sdkhost_value_free(&key);
                return fail(r, "invalidKey: object %zu: key %zu (object %zu) is not a string", object, i, key_object);
            }
            if (object_ref(r, start + (n + i) * (size_t)r->ref_size, &value_object)
                || decode_value(r, value_object, depth + 1, &value)) {
                sdkhost_value_free(&key);
                sdkhost_value_free(&value);
                return -1;
            }
            if (out->u.dictionary.count == out->u.dictionary.capacity) {
                size_t capacity = out->u.dictionary.capacity ? out->u.dictionary.capacity * 2 : 4;
                out->u.dictionary.entries = xrealloc_array(out->u.dictionary.entries, capacity, sizeof(sdkhost_entry));
                out->u.dictionary.capacity = capacity;
            }
            sdkhost_entry *e = &out->u.dictionary.entries[out->u.dictionary.count++];
            e->key = key.u.string.bytes;
            e->key_length = key.u.string.length;
            e->value = value;
        }
        drop_duplicate_keys(out);
        r->on_path[object] = 0;
        return 0;
    }
    default:
        return fail(r, "unsupportedObject: object %zu: marker 0x%02x (UID, set or unknown)", object, marker);
    }
}

int sdkhost_plist_decode(const void *payload, size_t length, sdkhost_value *value, char *why, size_t why_size) {
    reader r;
    memset(&r, 0, sizeof r);
    memset(value, 0, sizeof *value);
    r.base = payload;
    r.size = length;
    r.why = why;
    r.why_size = why_size;
    if (why && why_size) why[0] = 0;
    if (payload == NULL || length < 8 + 32 + 1) {
        if (payload != NULL && length >= 8 && memcmp(payload, "bplist00", 8) != 0)
            return fail(&r, "badMagic: payload does not start with bplist00"), EBADMSG;
        return fail(&r, "truncated: payload is %zu bytes; a bplist needs at least 41", length), EBADMSG;
    }
    if (memcmp(payload, "bplist00", 8) != 0) return fail(&r, "badMagic: payload does not start with bplist00"), EBADMSG;
    size_t t = length - 32;
    r.offset_size = r.base[t + 6];
    r.ref_size = r.base[t + 7];
    uint64_t count = read_be(r.base + t + 8, 8), top = read_be(r.base + t + 16, 8), table = read_be(r.base + t + 24, 8);
    if (r.offset_size < 1 || r.offset_size > 8 || r.ref_size < 1 || r.ref_size > 8)
        return fail(&r, "badTrailer: offset size %d / reference size %d not in 1...8", r.offset_size, r.ref_size), EBADMSG;
    if (count < 1) return fail(&r, "badTrailer: object count is 0"), EBADMSG;
    if (count > MAX_OBJECTS)
        return fail(&r, "tooManyObjects: payload declares %llu objects; the limit is %u", (unsigned long long)count, MAX_OBJECTS), EBADMSG;
    if (top >= count) return fail(&r, "badTrailer: top object %llu >= object count %llu", (unsigned long long)top, (unsigned long long)count), EBADMSG;
    if (table < 9 || table > t || count > (t - table) / (uint64_t)r.offset_size)
        return fail(&r, "badTrailer: offset table at %llu with %llu entries of %d bytes does not fit before the trailer at %zu",
                    (unsigned long long)table, (unsigned long long)count, r.offset_size, t), EBADMSG;
    if (r.ref_size < 8 && ((uint64_t)1 << (r.ref_size * 8)) < count)
        return fail(&r, "badTrailer: %llu objects cannot be addressed with %d-byte references", (unsigned long long)count, r.ref_size), EBADMSG;
    r.count = (size_t)count;
    r.top = (size_t)top;
    r.objects_end = (size_t)table;
    r.budget = MAX_OBJECTS;
    r.byte_budget = (int64_t)length > (MAX_DECODED_BYTES - (64 << 10)) / DECODE_EXPANSION
        ? MAX_DECODED_BYTES : (int64_t)length * DECODE_EXPANSION + (64 << 10);
    if (r.byte_budget > MAX_DECODED_BYTES) r.byte_budget = MAX_DECODED_BYTES;
    r.on_path = xcalloc(r.count, 1);
    int rc = decode_value(&r, r.top, 0, value);
    free(r.on_path);
    if (rc) {
        sdkhost_value_free(value);
        return EBADMSG;
    }
    return 0;
}

/* MARK: Files */

int sdkhost_file_from_bytes(const void *bytes, size_t length, const char *name) {
    const char *label = name ? name : "sdkhost-attachment";
    /* Sealed against execution from birth (MFD_NOEXEC_SEAL): the strict sandbox refuses a memfd without it.
     * Kernels before 6.3 do not know the flag (EINVAL). */
    int fd = memfd_create(label, MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL_FLAG);
    if (fd < 0 && errno == EINVAL) fd = memfd_create(label, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return -1;
    const uint8_t *p = bytes;
    size_t done = 0;
    while (done < length) {
        ssize_t n = write(fd, p + done, length - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            close(fd);
            errno = e;
            return -1;
        }
        done += (size_t)n;
    }
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

int sdkhost_file_open(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) return -1;
    struct stat st;
    int e = fstat(fd, &st) != 0 ? errno : S_ISREG(st.st_mode) ? 0 : EINVAL;
    if (e) {
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

int sdkhost_file_read_all(int fd, uint8_t **bytes, size_t *length) {
    struct stat st;
    *bytes = NULL;
    *length = 0;
    if (fstat(fd, &st) != 0) return errno;
    size_t capacity = st.st_size > 0 ? (size_t)st.st_size : 0, n = 0;
    uint8_t *buffer = capacity ? malloc(capacity) : NULL;
    if (capacity && buffer == NULL) return ENOMEM;
    for (;;) {
        if (n == capacity) {
            /* The file may be longer than fstat said (not a sealed one): read on to the end. */
            uint8_t probe[4096];
            ssize_t got = pread(fd, probe, sizeof probe, (off_t)n);
            if (got < 0 && errno == EINTR) continue;
            if (got < 0) { int e = errno; free(buffer); return e; }
            if (got == 0) break;
            if (capacity > SIZE_MAX / 2 - sizeof probe) { free(buffer); return ENOMEM; }
            capacity = capacity * 2 + sizeof probe;
            uint8_t *grown = realloc(buffer, capacity);
            if (grown == NULL) { free(buffer); return ENOMEM; }
            buffer = grown;
            memcpy(buffer + n, probe, (size_t)got);
            n += (size_t)got;
            continue;
        }
        ssize_t got = pread(fd, buffer + n, capacity - n, (off_t)n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) { int e = errno; free(buffer); return e; }
        if (got == 0) break;
        n += (size_t)got;
    }
    if (n == 0) {
        free(buffer);
        buffer = NULL;
    }
    *bytes = buffer;
    *length = n;
    return 0;
}

/* Why a descriptor received from the host cannot be an attachment, or NULL (FileAttachment.refusedOnReceipt): it
 * must be a regular file open for reading only, or a memfd sealed against writing, growing and shrinking. */
static const char *refused_on_receipt(int fd) {
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0) return "a descriptor fcntl refuses";
    if (flags & O_PATH) return "an O_PATH descriptor, not an open file";
    struct stat st;
    if (fstat(fd, &st) != 0) return "a descriptor fstat refuses";
    if (!S_ISREG(st.st_mode)) {
        if (S_ISSOCK(st.st_mode)) return "a socket, not a regular file or memfd";
        if (S_ISFIFO(st.st_mode)) return "a pipe, not a regular file or memfd";
        if (S_ISDIR(st.st_mode)) return "a directory, not a regular file or memfd";
        return "not a regular file or memfd";
    }
    /* Sealed against writing, growing and shrinking: a snapshot memfd (no other file can carry those seals), taken
       without reading its /proc link. Otherwise a memfd is refused, and any other file must be open read-only. */
    int seals = fcntl(fd, F_GET_SEALS);
    int needed = F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK;
    if (seals >= 0 && (seals & needed) == needed) return NULL;
    char link[64], target[16];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target);
    if (n >= 7 && memcmp(target, "/memfd:", 7) == 0) return "a memfd not sealed against writing, growing and shrinking";
    return (flags & O_ACCMODE) == O_RDONLY ? NULL : "open for writing; attachments are read-only";
}

/* MARK: The connection */

static int g_fd = 3;
static bool g_env_read;
static char g_identifier[256] = "unknown";
static int64_t g_idle_ms;
static int64_t g_leak_ms;
static int g_max_calls = 16;
static bool g_conformance;
static const sdkhost_extension *g_extension;
static pthread_t g_reader;
static bool g_running;
static pthread_mutex_t g_write_lock = PTHREAD_MUTEX_INITIALIZER;

static bool on_reader_thread(void) { return g_running && pthread_equal(pthread_self(), g_reader); }

static void wait_writable(void) {
    struct pollfd p = {.fd = g_fd, .events = POLLOUT};
    while (poll(&p, 1, -1) < 0 && errno == EINTR) {}
}

static _Noreturn void connection_lost(int error) {
    sdkhost_log("host connection lost: %s", strerror(error));
    exit(0);
}

/* Writes one whole frame under the write lock, `fds` (at most 64) attached to its first byte. A host that has
 * gone away ends the process. */
static void write_frame(const uint8_t *bytes, size_t length, const int *fds, size_t fd_count) {
    pthread_mutex_lock(&g_write_lock);
    size_t done = 0;
    if (fd_count > 0) {
        union {
            char bytes[CMSG_SPACE(sizeof(int) * SDKHOST_MAX_FILES_PER_MESSAGE)];
            struct cmsghdr align;
        } control;
        memset(&control, 0, sizeof control);
        struct iovec iov = {.iov_base = (void *)bytes, .iov_len = length};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.bytes,
                             .msg_controllen = CMSG_SPACE(sizeof(int) * fd_count)};
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * fd_count);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * fd_count);
        for (;;) {
            ssize_t n = sendmsg(g_fd, &msg, MSG_NOSIGNAL);
            if (n >= 0) { done = (size_t)n; break; }
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) { wait_writable(); continue; }
            int e = errno;
            pthread_mutex_unlock(&g_write_lock);
            connection_lost(e);
        }
    }
    while (done < length) {
        ssize_t n = send(g_fd, bytes + done, length - done, MSG_NOSIGNAL);
        if (n >= 0) { done += (size_t)n; continue; }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) { wait_writable(); continue; }
        int e = errno;
        pthread_mutex_unlock(&g_write_lock);
        connection_lost(e);
    }
    pthread_mutex_unlock(&g_write_lock);
}

/* MARK: Messages out
 *
 * A message is built as a shallow value tree: its containers come from an arena, its strings and the items'
 * values are borrowed from the caller, so nothing the caller sends is copied before encoding. */

typedef struct arena {
    void **blocks;
    size_t count, capacity;
} arena;

static void *arena_alloc(arena *a, size_t count, size_t size) {
    if (a->count == a->capacity) {
        a->capacity = a->capacity ? a->capacity * 2 : 8;
        a->blocks = xrealloc_array(a->blocks, a->capacity, sizeof(void *));
    }
    if (size != 0 && count > SIZE_MAX / size) out_of_memory();
    void *p = xcalloc(count ? count : 1, size);
    a->blocks[a->count++] = p;
    return p;
}

static void arena_free(arena *a) {
    for (size_t i = 0; i < a->count; i++) free(a->blocks[i]);
    free(a->blocks);
    memset(a, 0, sizeof *a);
}

static sdkhost_value view_string(const char *s, size_t n) {
    sdkhost_value v = {.kind = SDKHOST_STRING};
    v.u.string.bytes = (char *)s;
    v.u.string.length = n;
    return v;
}

static sdkhost_value view_cstring(const char *s) { return view_string(s ? s : "", s ? strlen(s) : 0); }

static sdkhost_value view_dictionary(arena *a, size_t capacity) {
    sdkhost_value v = {.kind = SDKHOST_DICTIONARY};
    v.u.dictionary.entries = arena_alloc(a, capacity, sizeof(sdkhost_entry));
    v.u.dictionary.capacity = capacity;
    return v;
}

/* Adds an entry to a view dictionary (its capacity was sized for every key added). */
static void view_set(sdkhost_value *d, const char *key, sdkhost_value value) {
    sdkhost_entry *e = &d->u.dictionary.entries[d->u.dictionary.count++];
    e->key = (char *)key;
    e->key_length = strlen(key);
    e->value = value;
}

/* {type, id} with room for `extra` more keys. */
static sdkhost_value view_message(arena *a, const char *type, const char *id, size_t extra) {
    sdkhost_value d = view_dictionary(a, 2 + extra);
    view_set(&d, "type", view_cstring(type));
    if (id) view_set(&d, "id", view_cstring(id));
    return d;
}

/* The items' wire form, their files numbered in order; their descriptors are appended to `fds`. */
static sdkhost_value view_items(arena *a, const sdkhost_item *items, size_t count, int *fds, size_t *fd_count,
                                size_t *files_total) {
    sdkhost_value array = {.kind = SDKHOST_ARRAY};
    array.u.array.elements = arena_alloc(a, count, sizeof(sdkhost_value));
    array.u.array.count = array.u.array.capacity = count;
    static const sdkhost_value empty_array = {.kind = SDKHOST_ARRAY};
    static const sdkhost_value empty_dictionary = {.kind = SDKHOST_DICTIONARY};
    for (size_t i = 0; i < count; i++) {
        const sdkhost_item *item = &items[i];
        sdkhost_value d = view_dictionary(a, 5);
        view_set(&d, "attachments", item->attachments.kind == SDKHOST_ARRAY ? item->attachments : empty_array);
        view_set(&d, "userInfo", item->user_info.kind == SDKHOST_DICTIONARY ? item->user_info : empty_dictionary);
        if (item->title) view_set(&d, "title", view_string(item->title, item->title_length));
        if (item->text) view_set(&d, "text", view_string(item->text, item->text_length));
        if (item->file_count > 0) {
            sdkhost_value files = {.kind = SDKHOST_ARRAY};
            files.u.array.elements = arena_alloc(a, item->file_count, sizeof(sdkhost_value));
            files.u.array.count = files.u.array.capacity = item->file_count;
            for (size_t k = 0; k < item->file_count; k++) {
                files.u.array.elements[k] = sdkhost_integer((int64_t)*files_total);
                if (*files_total < SDKHOST_MAX_FILES_PER_MESSAGE) fds[(*fd_count)++] = item->files[k];
                (*files_total)++;
            }
            view_set(&d, "files", files);
        }
        array.u.array.elements[i] = d;
    }
    return array;
}

/* An encoded frame and the descriptors it carries. */
typedef struct outgoing {
    uint8_t *frame;
    size_t length;
    int fds[SDKHOST_MAX_FILES_PER_MESSAGE];
    size_t fd_count;
} outgoing;

/* Encodes {type, id, items, fds?} plus call/service when given. Returns 0, or an error with `detail` set. */
static int encode_items_message(outgoing *out, const char *type, const char *id, const sdkhost_item *items, size_t count,
                                int64_t call, const char *service, char *detail, size_t detail_size) {
    arena a = {0};
    size_t total = 0;
    memset(out, 0, sizeof *out);
    sdkhost_value m = view_message(&a, type, id, 4);
    view_set(&m, "items", view_items(&a, items, count, out->fds, &out->fd_count, &total));
    if (total > 0) view_set(&m, "fds", sdkhost_integer((int64_t)total));
    if (call > 0) view_set(&m, "call", sdkhost_integer(call));
    if (service) view_set(&m, "service", view_cstring(service));
    int e;
    if (total > SDKHOST_MAX_FILES_PER_MESSAGE) {
        snprintf(detail, detail_size, "%zu file attachments in one message; at most %d", total, SDKHOST_MAX_FILES_PER_MESSAGE);
        e = EMSGSIZE;
    } else {
        e = frame_encode(&m, &out->frame, &out->length, detail, detail_size);
    }
    arena_free(&a);
    if (e) out->fd_count = 0;
    return e;
}

/* Encodes and writes a message that carries no items and cannot fail to encode (small, built here). */
static void send_value(const sdkhost_value *m) {
    uint8_t *frame;
    size_t length;
    char detail[160];
    if (frame_encode(m, &frame, &length, detail, sizeof detail) != 0) {
        sdkhost_log("cannot send a message: %s", detail);
        return;
    }
    write_frame(frame, length, NULL, 0);
    free(frame);
}

static sdkhost_value view_error(arena *a, const char *domain, int64_t code, const char *message) {
    sdkhost_value e = view_dictionary(a, 3);
    view_set(&e, "domain", view_cstring(domain));
    view_set(&e, "code", sdkhost_integer(code));
    view_set(&e, "message", view_cstring(message));
    return e;
}

static void encode_cancelled(outgoing *out, const char *id, const char *domain, int64_t code, const char *message) {
    arena a = {0};
    char detail[160];
    memset(out, 0, sizeof *out);
    sdkhost_value m = view_message(&a, "cancelled", id, 1);
    view_set(&m, "error", view_error(&a, domain, code, message));
    if (frame_encode(&m, &out->frame, &out->length, detail, sizeof detail) != 0) {
        /* Only an absurdly long message gets here: say so within the limit. */
        arena_free(&a);
        a = (arena){0};
        m = view_message(&a, "cancelled", id, 1);
        view_set(&m, "error", view_error(&a, domain, code, "(the error message was too long to send)"));
        if (frame_encode(&m, &out->frame, &out->length, detail, sizeof detail) != 0) abort();
    }
    arena_free(&a);
}

static void send_host_call_cancel(const char *id, int64_t call) {
    arena a = {0};
    sdkhost_value m = view_message(&a, "hostCallCancel", id, 1);
    view_set(&m, "call", sdkhost_integer(call));
    send_value(&m);
    arena_free(&a);
}

/* MARK: Requests */

struct sdkhost_request {
    char id[40];
    sdkhost_item *items;
    size_t item_count;
    pthread_mutex_t lock;        /* the fields below, up to send_lock */
    pthread_cond_t changed;      /* credit, finish or cancel: wakes senders waiting for credit */
    int refs;                    /* memory: registry membership, holders, the runtime's own holds */
    int holders;                 /* the handler while it runs, and the extension's retains */
    bool finished, cancelled;
    int credits;
    void *user_data;
    bool orphaned;               /* unfinished with no holder left: the runtime answers the host's cancel */
    pthread_mutex_t send_lock;   /* orders this request's partials before its finish */
    bool calls_ended;            /* under g_calls_lock: calls made from now on end at once */
    sdkhost_request *next_active;          /* under g_registry_lock */
    bool lingering, leak_reported;         /* under g_lingering_lock */
    uint64_t ended_ns;
    sdkhost_request *lingering_prev, *lingering_next;
};

static pthread_mutex_t g_registry_lock = PTHREAD_MUTEX_INITIALIZER;
static sdkhost_request *g_active;
static size_t g_active_count;
static pthread_mutex_t g_lingering_lock = PTHREAD_MUTEX_INITIALIZER;
static sdkhost_request *g_lingering;

static void calls_end(sdkhost_request *request, bool cancelled, bool tell_host);

static void request_ref(sdkhost_request *r) {
    pthread_mutex_lock(&r->lock);
    r->refs++;
    pthread_mutex_unlock(&r->lock);
}

static void request_unref(sdkhost_request *r) {
    pthread_mutex_lock(&r->lock);
    int left = --r->refs;
    pthread_mutex_unlock(&r->lock);
    if (left > 0) return;
    sdkhost_items_free(r->items, r->item_count);
    pthread_mutex_destroy(&r->lock);
    pthread_cond_destroy(&r->changed);
    pthread_mutex_destroy(&r->send_lock);
    free(r);
}

static sdkhost_request *request_new(const char *id, sdkhost_item *items, size_t count) {
    sdkhost_request *r = xcalloc(1, sizeof *r);
    snprintf(r->id, sizeof r->id, "%s", id);
    r->items = items;
    r->item_count = count;
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->changed, NULL);
    pthread_mutex_init(&r->send_lock, NULL);
    r->credits = SDKHOST_STREAM_WINDOW;
    return r;
}

static void registry_add(sdkhost_request *r) {
    pthread_mutex_lock(&g_registry_lock);
    r->next_active = g_active;
    g_active = r;
    g_active_count++;
    pthread_mutex_unlock(&g_registry_lock);
}

/* The active request `id`, with a reference the caller gives back (request_unref), or NULL. */
static sdkhost_request *registry_find(const char *id) {
    pthread_mutex_lock(&g_registry_lock);
    sdkhost_request *r = g_active;
    while (r != NULL && strcmp(r->id, id) != 0) r = r->next_active;
    if (r) request_ref(r);
    pthread_mutex_unlock(&g_registry_lock);
    return r;
}

/* Takes the request out of the registry; true if it was there (the registry's reference is the caller's now). */
static bool registry_remove(sdkhost_request *r) {
    pthread_mutex_lock(&g_registry_lock);
    sdkhost_request **p = &g_active;
    while (*p != NULL && *p != r) p = &(*p)->next_active;
    bool found = *p != NULL;
    if (found) {
        *p = r->next_active;
        g_active_count--;
    }
    pthread_mutex_unlock(&g_registry_lock);
    return found;
}

static size_t active_count(void) {
    pthread_mutex_lock(&g_registry_lock);
    size_t n = g_active_count;
    pthread_mutex_unlock(&g_registry_lock);
    return n;
}

static void lingering_unlink(sdkhost_request *r) {
    if (!r->lingering) return;
    if (r->lingering_prev) r->lingering_prev->lingering_next = r->lingering_next;
    else g_lingering = r->lingering_next;
    if (r->lingering_next) r->lingering_next->lingering_prev = r->lingering_prev;
    r->lingering = false;
    r->lingering_prev = r->lingering_next = NULL;
}

/* The request ended: out of the registry; with the leak check on and someone still holding it, it lingers. */
static void request_ended(sdkhost_request *r) {
    if (!registry_remove(r)) return;
    if (g_leak_ms > 0) {
        pthread_mutex_lock(&g_lingering_lock);
        pthread_mutex_lock(&r->lock);
        if (r->holders > 0 && !r->lingering) {
            r->lingering = true;
            r->ended_ns = monotonic_ns();
            r->lingering_prev = NULL;
            r->lingering_next = g_lingering;
            if (g_lingering) g_lingering->lingering_prev = r;
            g_lingering = r;
        }
        pthread_mutex_unlock(&r->lock);
        pthread_mutex_unlock(&g_lingering_lock);
    }
    request_unref(r);  /* the registry's */
}

/* Sends the finishing message `m` (complete or cancelled) if the request is not finished yet. */
static bool request_finish(sdkhost_request *r, outgoing *m, const char *verb) {
    request_ref(r);
    pthread_mutex_lock(&r->lock);
    bool first = !r->finished;
    r->finished = true;
    pthread_cond_broadcast(&r->changed);
    pthread_mutex_unlock(&r->lock);
    if (!first) {
        sdkhost_log("%s on request %s that already finished; ignored", verb, r->id);
        free(m->frame);
        request_unref(r);
        return false;
    }
    /* Its calls still waiting end now; the host cancels them on its side when it reads this message. */
    calls_end(r, false, false);
    request_ended(r);
    pthread_mutex_lock(&r->send_lock);
    write_frame(m->frame, m->length, m->fds, m->fd_count);
    pthread_mutex_unlock(&r->send_lock);
    free(m->frame);
    request_unref(r);
    return true;
}

const char *sdkhost_request_id(const sdkhost_request *request) { return request->id; }

const sdkhost_item *sdkhost_request_items(const sdkhost_request *request, size_t *count) {
    if (count) *count = request->item_count;
    return request->items;
}

bool sdkhost_request_is_cancelled(const sdkhost_request *request) {
    sdkhost_request *r = (sdkhost_request *)request;
    pthread_mutex_lock(&r->lock);
    bool cancelled = r->cancelled;
    pthread_mutex_unlock(&r->lock);
    return cancelled;
}

bool sdkhost_request_is_finished(const sdkhost_request *request) {
    sdkhost_request *r = (sdkhost_request *)request;
    pthread_mutex_lock(&r->lock);
    bool finished = r->finished;
    pthread_mutex_unlock(&r->lock);
    return finished;
}

bool sdkhost_cancel_request(sdkhost_request *request, const char *domain, int64_t code, const char *message) {
    outgoing m;
    encode_cancelled(&m, request->id, domain ? domain : "", code, message ? message : "");
    return request_finish(request, &m, "cancelRequest");
}

bool sdkhost_complete_request(sdkhost_request *request, const sdkhost_item *items, size_t count) {
    if (sdkhost_request_is_finished(request)) {
        sdkhost_log("completeRequest on request %s that already finished; ignored", request->id);
        return false;
    }
    outgoing m;
    char detail[160];
    int failed = encode_items_message(&m, "complete", request->id, items, count, 0, NULL, detail, sizeof detail);
    if (failed != 0) {
        /* Too large for a frame, or a value no frame can hold: the request still ends, cancelled with the reason. */
        const char *what = failed == EINVAL ? "reply cannot be encoded" : "reply too large";
        char message[200];
        snprintf(message, sizeof message, "%s: %s", what, detail);
        sdkhost_log("%s for %s: %s", what, request->id, detail);
        encode_cancelled(&m, request->id, "SDKExtension", 3, message);
    }
    return request_finish(request, &m, "completeRequest");
}

bool sdkhost_send_partial(sdkhost_request *request, const sdkhost_item *items, size_t count) {
    sdkhost_request *r = request;
    outgoing m;
    char detail[160];
    if (encode_items_message(&m, "partial", r->id, items, count, 0, NULL, detail, sizeof detail) != 0) {
        sdkhost_log("cannot send a partial result of %s: %s", r->id, detail);
        return false;
    }
    pthread_mutex_lock(&r->lock);
    for (;;) {
        if (r->finished || r->cancelled) {
            pthread_mutex_unlock(&r->lock);
            sdkhost_log("send on request %s that has finished or was cancelled; dropped", r->id);
            free(m.frame);
            return false;
        }
        if (r->credits > 0) break;
        if (on_reader_thread()) {
            pthread_mutex_unlock(&r->lock);
            sdkhost_log("send on request %s would wait for credit on the reader thread; dropped", r->id);
            free(m.frame);
            return false;
        }
        pthread_cond_wait(&r->changed, &r->lock);
    }
    r->credits--;
    pthread_mutex_unlock(&r->lock);
    /* Under the send lock, re-checked: a finish that came meanwhile has gone out (or is waiting to go) after
     * this, never before. */
    pthread_mutex_lock(&r->send_lock);
    pthread_mutex_lock(&r->lock);
    bool ended = r->finished || r->cancelled;
    if (ended) r->credits++;
    pthread_mutex_unlock(&r->lock);
    if (!ended) write_frame(m.frame, m.length, m.fds, m.fd_count);
    pthread_mutex_unlock(&r->send_lock);
    free(m.frame);
    if (ended) sdkhost_log("send on request %s that has finished or was cancelled; dropped", r->id);
    return !ended;
}

void sdkhost_request_retain(sdkhost_request *request) {
    pthread_mutex_lock(&request->lock);
    request->holders++;
    request->refs++;
    pthread_mutex_unlock(&request->lock);
}

void sdkhost_request_release(sdkhost_request *request) {
    sdkhost_request *r = request;
    pthread_mutex_lock(&r->lock);
    int holders = --r->holders;
    bool orphaned = holders == 0 && !r->finished, answer = orphaned && r->cancelled;
    if (orphaned) r->orphaned = true;
    pthread_mutex_unlock(&r->lock);
    if (holders == 0) {
        if (answer) {
            /* The host cancelled it and nobody can finish it any more: acknowledge, so the host need not kill. */
            sdkhost_cancel_request(r, "SDKHost", 1, "cancelled by the host");
        } else if (orphaned) {
            /* As a Swift synchronous handler that returns without finishing: the request stays open (nothing is
             * sent, which matters to a worker about to stop or crash) until the host cancels it. */
            sdkhost_log("the handler returned without finishing request %s and holds no reference to it; "
                        "it stays open until the host cancels it", r->id);
        }
        pthread_mutex_lock(&g_lingering_lock);
        lingering_unlink(r);
        pthread_mutex_unlock(&g_lingering_lock);
    }
    request_unref(r);
}

void sdkhost_request_set_user_data(sdkhost_request *request, void *data) {
    pthread_mutex_lock(&request->lock);
    request->user_data = data;
    pthread_mutex_unlock(&request->lock);
}

void *sdkhost_request_user_data(const sdkhost_request *request) {
    sdkhost_request *r = (sdkhost_request *)request;
    pthread_mutex_lock(&r->lock);
    void *data = r->user_data;
    pthread_mutex_unlock(&r->lock);
    return data;
}

/* The requests that ended at least the leak delay ago and are still held, each reported once. */
static void check_leaks(void) {
    char ids[32][40];
    uint64_t ages[32];
    size_t found = 0;
    uint64_t now = monotonic_ns(), delay = (uint64_t)g_leak_ms * 1000000u;
    pthread_mutex_lock(&g_lingering_lock);
    sdkhost_request *r = g_lingering;
    while (r != NULL && found < 32) {
        sdkhost_request *next = r->lingering_next;
        if (now - r->ended_ns >= delay) {
            memcpy(ids[found], r->id, sizeof r->id);
            ages[found++] = (now - r->ended_ns) / 1000000u;
            lingering_unlink(r);
            r->leak_reported = true;
        }
        r = next;
    }
    pthread_mutex_unlock(&g_lingering_lock);
    for (size_t i = 0; i < found; i++) {
        arena a = {0};
        sdkhost_value alive = {.kind = SDKHOST_ARRAY};
        alive.u.array.elements = arena_alloc(&a, 1, sizeof(sdkhost_value));
        alive.u.array.elements[0] = view_cstring("context");
        alive.u.array.count = alive.u.array.capacity = 1;
        sdkhost_value m = view_message(&a, "leak", ids[i], 2);
        view_set(&m, "alive", alive);
        view_set(&m, "afterMs", sdkhost_integer((int64_t)ages[i]));
        send_value(&m);
        arena_free(&a);
    }
}

/* MARK: Host calls (HostCalls.swift): call numbers are the worker's, unique across its requests. */

typedef struct pending_call {
    int64_t call;
    sdkhost_request *request;  /* holds a reference */
    sdkhost_call_callback callback;
    void *context;
    struct pending_call *next;
} pending_call;

static pthread_mutex_t g_calls_lock = PTHREAD_MUTEX_INITIALIZER;
static pending_call *g_calls;  /* oldest first */
static int64_t g_next_call = 1;

static void error_result(sdkhost_call_result *result, const char *domain, int64_t code, const char *message) {
    memset(result, 0, sizeof *result);
    result->status = SDKHOST_CALL_ERROR;
    result->error.domain = dup_bytes(domain, strlen(domain));
    result->error.code = code;
    result->error.message = dup_bytes(message, strlen(message));
}

static void resolve(pending_call *p, sdkhost_call_result *result) {
    p->callback(p->request, p->call, result, p->context);
    request_unref(p->request);
    free(p);
}

static pending_call *calls_take(int64_t call, const sdkhost_request *owner) {
    pthread_mutex_lock(&g_calls_lock);
    pending_call **q = &g_calls;
    while (*q != NULL && ((*q)->call != call || (owner != NULL && (*q)->request != owner))) q = &(*q)->next;
    pending_call *p = *q;
    if (p) *q = p->next;
    pthread_mutex_unlock(&g_calls_lock);
    return p;
}

static void discard_result(sdkhost_request *request, int64_t call, sdkhost_call_result *result, void *context) {
    (void)request;
    (void)call;
    (void)context;
    sdkhost_call_result_free(result);
}

int64_t sdkhost_call_host_async(sdkhost_request *request, const char *service, const sdkhost_item *items,
                                size_t count, sdkhost_call_callback callback, void *context) {
    sdkhost_call_result result;
    if (callback == NULL) callback = discard_result;
    pthread_mutex_lock(&g_calls_lock);
    if (request->calls_ended) {
        pthread_mutex_unlock(&g_calls_lock);
        error_result(&result, "SDKExtension", 5, "the request has ended");
        callback(request, 0, &result, context);
        return 0;
    }
    int in_flight = 0;
    pending_call **tail = &g_calls;
    for (; *tail != NULL; tail = &(*tail)->next)
        if ((*tail)->request == request) in_flight++;
    if (in_flight >= g_max_calls) {
        pthread_mutex_unlock(&g_calls_lock);
        char message[120];
        snprintf(message, sizeof message, "more than %d host calls in flight (MaxHostCallsInFlight)", g_max_calls);
        error_result(&result, "SDKExtension", 4, message);
        callback(request, 0, &result, context);
        return 0;
    }
    pending_call *p = xcalloc(1, sizeof *p);
    p->call = g_next_call++;
    p->request = request;
    p->callback = callback;
    p->context = context;
    request_ref(request);
    *tail = p;
    int64_t call = p->call;
    pthread_mutex_unlock(&g_calls_lock);

    outgoing m;
    char detail[160];
    if (encode_items_message(&m, "hostCall", request->id, items, count, call, service ? service : "", detail, sizeof detail) != 0) {
        sdkhost_log("cannot send host call %lld of %s: %s", (long long)call, request->id, detail);
        /* Never sent: it ends here, unless its request's end took it first. */
        pending_call *taken = calls_take(call, NULL);
        if (taken) {
            error_result(&result, "SDKExtension", 7, "the call cannot be sent (too large for a frame)");
            resolve(taken, &result);
        }
        return 0;
    }
    write_frame(m.frame, m.length, m.fds, m.fd_count);
    free(m.frame);
    return call;
}

bool sdkhost_cancel_host_call(sdkhost_request *request, int64_t call) {
    pending_call *p = calls_take(call, request);
    if (p == NULL) return false;
    send_host_call_cancel(request->id, call);
    sdkhost_call_result result;
    memset(&result, 0, sizeof result);
    result.status = SDKHOST_CALL_CANCELLED;
    resolve(p, &result);
    return true;
}

/* The request ended: its calls still waiting end (cancelled if the host cancelled it, else "the request has
 * ended"), and any it makes from now on end at once. `tell_host`: send hostCallCancel for each. */
static void calls_end(sdkhost_request *request, bool cancelled, bool tell_host) {
    pending_call *mine = NULL, **mine_tail = &mine;
    pthread_mutex_lock(&g_calls_lock);
    request->calls_ended = true;
    pending_call **q = &g_calls;
    while (*q != NULL) {
        if ((*q)->request == request) {
            pending_call *p = *q;
            *q = p->next;
            p->next = NULL;
            *mine_tail = p;
            mine_tail = &p->next;
        } else {
            q = &(*q)->next;
        }
    }
    pthread_mutex_unlock(&g_calls_lock);
    while (mine != NULL) {
        pending_call *p = mine;
        mine = p->next;
        if (tell_host) send_host_call_cancel(request->id, p->call);
        sdkhost_call_result result;
        if (cancelled) {
            memset(&result, 0, sizeof result);
            result.status = SDKHOST_CALL_CANCELLED;
        } else {
            error_result(&result, "SDKExtension", 5, "the request has ended");
        }
        resolve(p, &result);
    }
}

typedef struct blocking_call {
    pthread_mutex_t lock;
    pthread_cond_t done_changed;
    bool done;
    sdkhost_call_result result;
} blocking_call;

static void blocking_call_done(sdkhost_request *request, int64_t call, sdkhost_call_result *result, void *context) {
    (void)request;
    (void)call;
    blocking_call *b = context;
    pthread_mutex_lock(&b->lock);
    b->result = *result;
    b->done = true;
    pthread_cond_signal(&b->done_changed);
    pthread_mutex_unlock(&b->lock);
}

sdkhost_call_status sdkhost_call_host(sdkhost_request *request, const char *service, const sdkhost_item *items,
                                      size_t count, sdkhost_call_result *result) {
    if (on_reader_thread()) {
        /* The answer is read by this very thread: waiting here would wait for good. */
        error_result(result, "SDKExtension", 10, "a blocking host call on the runtime's reader thread");
        return result->status;
    }
    blocking_call b;
    memset(&b, 0, sizeof b);
    pthread_mutex_init(&b.lock, NULL);
    pthread_cond_init(&b.done_changed, NULL);
    sdkhost_call_host_async(request, service, items, count, blocking_call_done, &b);
    pthread_mutex_lock(&b.lock);
    while (!b.done) pthread_cond_wait(&b.done_changed, &b.lock);
    pthread_mutex_unlock(&b.lock);
    pthread_mutex_destroy(&b.lock);
    pthread_cond_destroy(&b.done_changed);
    *result = b.result;
    return result->status;
}

void sdkhost_call_result_free(sdkhost_call_result *result) {
    if (result == NULL) return;
    sdkhost_items_free(result->items, result->item_count);
    free(result->error.domain);
    free(result->error.message);
    memset(result, 0, sizeof *result);
}

/* MARK: Conformance mode (SDKHOST_CONFORMANCE=1): a begin whose first item's title is "sdkhost.conformance" is
 * answered by the runtime itself, its first item's text naming the command. */

static void cancelled_by_host(sdkhost_request *r) {
    sdkhost_cancel_request(r, "SDKHost", 1, "cancelled by the host");
}

static void conformance_call_done(sdkhost_request *r, int64_t call, sdkhost_call_result *result, void *context) {
    (void)call;
    (void)context;
    if (result->status == SDKHOST_CALL_RESULT) {
        sdkhost_complete_request(r, result->items, result->item_count);
    } else if (result->status == SDKHOST_CALL_ERROR) {
        sdkhost_cancel_request(r, result->error.domain, result->error.code, result->error.message);
    } else {
        cancelled_by_host(r);
    }
    sdkhost_call_result_free(result);
    sdkhost_request_release(r);  /* taken before the call */
}

static void conformance_files(sdkhost_request *r) {
    sdkhost_item reply = sdkhost_item_make("files", NULL);
    for (size_t i = 0; i < r->item_count; i++) {
        for (size_t k = 0; k < r->items[i].file_count; k++) {
            uint8_t *bytes;
            size_t length;
            int e = sdkhost_file_read_all(r->items[i].files[k], &bytes, &length);
            int fd = -1;
            if (e == 0) {
                for (size_t a = 0, b = length; a + 1 < b; a++, b--) {
                    uint8_t t = bytes[a];
                    bytes[a] = bytes[b - 1];
                    bytes[b - 1] = t;
                }
                fd = sdkhost_file_from_bytes(bytes, length, "sdkhost-conformance");
                if (fd < 0) e = errno;
                free(bytes);
            }
            if (fd < 0) {
                char message[160];
                snprintf(message, sizeof message, "cannot reverse file %zu: %s", reply.file_count, strerror(e));
                sdkhost_cancel_request(r, "sdkhost.conformance", 3, message);
                sdkhost_item_free(&reply);
                return;
            }
            sdkhost_item_add_file(&reply, fd);
        }
    }
    sdkhost_complete_request(r, &reply, 1);
    sdkhost_item_free(&reply);
}

/* Parses a non-negative decimal count; false for anything else. */
static bool parse_count(const char *s, long long *out) {
    if (s == NULL || *s == 0) return false;
    long long v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > (LLONG_MAX - 9) / 10) return false;
        v = v * 10 + (*s - '0');
    }
    *out = v;
    return true;
}

static void conformance_run(sdkhost_request *r) {
    const char *command = r->items[0].text ? r->items[0].text : "";
    long long n;
    if (strcmp(command, "echo") == 0) {
        sdkhost_complete_request(r, r->items, r->item_count);
    } else if (strncmp(command, "stream:", 7) == 0 && parse_count(command + 7, &n)) {
        char text[32];
        for (long long k = 1; k <= n; k++) {
            snprintf(text, sizeof text, "%lld", k);
            sdkhost_item item = sdkhost_item_make(NULL, text);
            bool sent = sdkhost_send_partial(r, &item, 1);
            sdkhost_item_free(&item);
            if (!sent) {
                if (sdkhost_request_is_cancelled(r)) cancelled_by_host(r);
                return;
            }
        }
        snprintf(text, sizeof text, "%lld", n);
        sdkhost_item item = sdkhost_item_make(NULL, text);
        sdkhost_complete_request(r, &item, 1);
        sdkhost_item_free(&item);
    } else if (strcmp(command, "files") == 0) {
        conformance_files(r);
    } else if (strncmp(command, "call:", 5) == 0) {
        sdkhost_item ping = sdkhost_item_make(NULL, "ping");
        sdkhost_request_retain(r);
        sdkhost_call_host_async(r, command + 5, &ping, 1, conformance_call_done, NULL);
        sdkhost_item_free(&ping);
    } else {
        size_t length = strlen(command);
        char *message = xmalloc(length + sizeof "unknown command ");
        memcpy(message, "unknown command ", sizeof "unknown command " - 1);
        memcpy(message + sizeof "unknown command " - 1, command, length + 1);
        sdkhost_cancel_request(r, "sdkhost.conformance", 2, message);
        free(message);
    }
}

/* MARK: Handler threads */

static void *handler_thread(void *argument) {
    sdkhost_request *r = argument;
    g_extension->begin(r, g_extension->context);
    sdkhost_request_release(r);
    return NULL;
}

static void *conformance_thread(void *argument) {
    sdkhost_request *r = argument;
    conformance_run(r);
    sdkhost_request_release(r);
    return NULL;
}

/* MARK: Messages in */

static _Noreturn void protocol_error(const char *format, ...) SDKHOST_PRINTF(1, 2);
static _Noreturn void protocol_error(const char *format, ...) {
    char text[600];
    va_list args;
    va_start(args, format);
    vsnprintf(text, sizeof text, format, args);
    va_end(args);
    sdkhost_log("protocol error from host: %s; exiting", text);
    exit(2);
}

/* Descriptors received and not yet claimed by a complete frame, oldest first. */
static int *g_queue;
static size_t g_queue_count, g_queue_capacity;

static void queue_push(int fd) {
    if (g_queue_count == g_queue_capacity) {
        g_queue_capacity = g_queue_capacity ? g_queue_capacity * 2 : 16;
        g_queue = xrealloc_array(g_queue, g_queue_capacity, sizeof(int));
    }
    g_queue[g_queue_count++] = fd;
}

static sdkhost_value *field(sdkhost_value *d, const char *key) { return (sdkhost_value *)sdkhost_dictionary_get(d, key); }

static bool is_uuid(const sdkhost_value *v) {
    if (v == NULL || v->kind != SDKHOST_STRING || v->u.string.length != 36) return false;
    for (size_t i = 0; i < 36; i++) {
        char c = v->u.string.bytes[i];
        bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? c != '-' : !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return false;
    }
    return true;
}

typedef struct incoming {
    const char *type;
    sdkhost_value *root;
    int claimed[SDKHOST_MAX_FILES_PER_MESSAGE];
    bool taken[SDKHOST_MAX_FILES_PER_MESSAGE];
    size_t claimed_count;
} incoming;

static const char *kind_name(const sdkhost_value *v) {
    static const char *names[] = {"none", "string", "integer", "real", "bool", "date", "data", "array", "dictionary"};
    return v == NULL ? "missing" : names[v->kind];
}

static _Noreturn void missing(const incoming *in, const char *what, const char *key) {
    protocol_error("'%s' needs %s '%s'", in->type, what, key);
}

static const char *need_string(incoming *in, const char *key) {
    sdkhost_value *v = field(in->root, key);
    if (v == NULL || v->kind != SDKHOST_STRING) missing(in, "a string", key);
    return v->u.string.bytes;
}

static int64_t need_integer(incoming *in, const char *key) {
    sdkhost_value *v = field(in->root, key);
    if (v == NULL || v->kind != SDKHOST_INTEGER) missing(in, "an integer", key);
    return v->u.integer;
}

static const char *need_id(incoming *in) {
    sdkhost_value *v = field(in->root, "id");
    if (v == NULL || v->kind != SDKHOST_STRING) missing(in, "a string", "id");
    if (!is_uuid(v)) {
        char shown[128];
        protocol_error("'%s' id '%s' is not a UUID", in->type, printable(v->u.string.bytes, v->u.string.length, shown));
    }
    return v->u.string.bytes;
}

static void optional_of_kind(incoming *in, const char *key, sdkhost_kind kind, const char *what) {
    sdkhost_value *v = field(in->root, key);
    if (v != NULL && v->kind != kind) missing(in, what, key);
}

static void need_strings(incoming *in, const char *key, bool optional) {
    sdkhost_value *v = field(in->root, key);
    if (v == NULL && optional) return;
    if (v == NULL || v->kind != SDKHOST_ARRAY) missing(in, "an array", key);
    for (size_t i = 0; i < v->u.array.count; i++)
        if (v->u.array.elements[i].kind != SDKHOST_STRING) protocol_error("'%s' %s must be strings", in->type, key);
}

static void need_error(incoming *in, sdkhost_error *out) {
    sdkhost_value *e = field(in->root, "error");
    if (e == NULL) protocol_error("'%s' needs an 'error'", in->type);
    sdkhost_value *domain = field(e, "domain"), *code = field(e, "code"), *message = field(e, "message");
    if (domain == NULL || domain->kind != SDKHOST_STRING || code == NULL || code->kind != SDKHOST_INTEGER
        || message == NULL || message->kind != SDKHOST_STRING)
        protocol_error("error must be {domain: string, code: integer, message: string}");
    if (out) {
        out->domain = dup_bytes(domain->u.string.bytes, domain->u.string.length);
        out->code = code->u.integer;
        out->message = dup_bytes(message->u.string.bytes, message->u.string.length);
    }
}

/* Steals a string value's bytes out of the decoded tree. */
static char *take_string(sdkhost_value *v, size_t *length) {
    char *bytes = v->u.string.bytes;
    *length = v->u.string.length;
    v->u.string.bytes = NULL;
    v->kind = SDKHOST_NONE;
    return bytes;
}

/* The message's items (ExtensionItem(plist:files:)), moved out of the decoded tree, their `files` resolved
 * against the descriptors the frame claimed: the first reference to one takes it, a later one duplicates it. */
static sdkhost_item *need_items(incoming *in, size_t *count) {
    sdkhost_value *raw = field(in->root, "items");
    if (raw == NULL || raw->kind != SDKHOST_ARRAY) missing(in, "an array", "items");
    size_t n = raw->u.array.count;
    sdkhost_item *items = xcalloc(n, sizeof(sdkhost_item));
    for (size_t i = 0; i < n; i++) {
        sdkhost_value *d = &raw->u.array.elements[i];
        if (d->kind != SDKHOST_DICTIONARY) protocol_error("item is a %s, not a dictionary", kind_name(d));
        sdkhost_item *item = &items[i];
        sdkhost_value *files = field(d, "files");
        if (files != NULL) {
            if (files->kind != SDKHOST_ARRAY) protocol_error("item files is a %s, not an array", kind_name(files));
            for (size_t k = 0; k < files->u.array.count; k++) {
                sdkhost_value *index = &files->u.array.elements[k];
                if (index->kind != SDKHOST_INTEGER || index->u.integer < 0 || (uint64_t)index->u.integer >= in->claimed_count)
                    protocol_error("item files entry does not name one of the message's %zu descriptor(s)", in->claimed_count);
                size_t at = (size_t)index->u.integer;
                int fd;
                if (!in->taken[at]) {
                    fd = in->claimed[at];
                    in->taken[at] = true;
                } else {
                    fd = fcntl(in->claimed[at], F_DUPFD_CLOEXEC, 0);
                    if (fd < 0) {
                        sdkhost_log("cannot duplicate a received descriptor: %s; exiting", strerror(errno));
                        exit(1);
                    }
                }
                sdkhost_item_add_file(item, fd);
            }
        }
        sdkhost_value *title = field(d, "title"), *text = field(d, "text");
        if (title != NULL && title->kind != SDKHOST_STRING) protocol_error("item title is a %s, not a string", kind_name(title));
        if (text != NULL && text->kind != SDKHOST_STRING) protocol_error("item text is a %s, not a string", kind_name(text));
        if (title) item->title = take_string(title, &item->title_length);
        if (text) item->text = take_string(text, &item->text_length);
        sdkhost_value *attachments = field(d, "attachments"), *user_info = field(d, "userInfo");
        if (attachments != NULL && attachments->kind != SDKHOST_ARRAY)
            protocol_error("item attachments is a %s, not an array", kind_name(attachments));
        if (user_info != NULL && user_info->kind != SDKHOST_DICTIONARY)
            protocol_error("item userInfo is a %s, not a dictionary", kind_name(user_info));
        if (attachments) {
            item->attachments = *attachments;
            attachments->kind = SDKHOST_NONE;
        } else {
            item->attachments = sdkhost_array();
        }
        if (user_info) {
            item->user_info = *user_info;
            user_info->kind = SDKHOST_NONE;
        } else {
            item->user_info = sdkhost_dictionary();
        }
    }
    *count = n;
    return items;
}

static void handle_hello(incoming *in) {
    int64_t version = need_integer(in, "version");
    need_string(in, "identifier");
    need_integer(in, "hostPid");
    int64_t idle = need_integer(in, "idleTimeoutMs");
    if (version != PROTOCOL_VERSION) {
        sdkhost_log("host speaks protocol %lld, we speak %d; exiting", (long long)version, PROTOCOL_VERSION);
        exit(2);
    }
    g_idle_ms = idle;
    arena a = {0};
    sdkhost_value m = view_message(&a, "welcome", NULL, 3);
    view_set(&m, "version", sdkhost_integer(PROTOCOL_VERSION));
    view_set(&m, "identifier", view_cstring(g_identifier));
    view_set(&m, "pid", sdkhost_integer(getpid()));
    send_value(&m);
    arena_free(&a);
}

static uint64_t g_last_begin;

static void handle_begin(incoming *in) {
    const char *id = need_id(in);
    optional_of_kind(in, "extension", SDKHOST_STRING, "a string");
    optional_of_kind(in, "deadlineMs", SDKHOST_INTEGER, "an integer");
    size_t count;
    sdkhost_item *items = need_items(in, &count);
    g_last_begin = monotonic_ns();
    sdkhost_request *r = request_new(id, items, count);
    bool conformance = g_conformance && count > 0 && items[0].title != NULL && strcmp(items[0].title, "sdkhost.conformance") == 0
        && items[0].title_length == strlen("sdkhost.conformance");
    if (conformance && items[0].text != NULL && strcmp(items[0].text, "wait") == 0) {
        /* Nothing to run: the host's cancel answers it (handle_cancel). */
        r->orphaned = true;
        r->refs = 1;  /* the registry's */
        registry_add(r);
        return;
    }
    r->refs = 2;      /* the registry's and the handler's */
    r->holders = 1;
    registry_add(r);
    pthread_attr_t attributes;
    pthread_t thread;
    pthread_attr_init(&attributes);
    pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
    int e = pthread_create(&thread, &attributes, conformance ? conformance_thread : handler_thread, r);
    pthread_attr_destroy(&attributes);
    if (e != 0) {
        char message[160];
        snprintf(message, sizeof message, "no thread for the handler: %s", strerror(e));
        sdkhost_log("request %s: %s", r->id, message);
        sdkhost_cancel_request(r, "SDKExtension", 9, message);
        sdkhost_request_release(r);
    }
}

static void handle_cancel(incoming *in) {
    sdkhost_request *r = registry_find(need_id(in));
    if (r == NULL) return;
    pthread_mutex_lock(&r->lock);
    r->cancelled = true;
    pthread_cond_broadcast(&r->changed);
    bool orphaned = r->orphaned;
    pthread_mutex_unlock(&r->lock);
    calls_end(r, true, true);
    if (orphaned) {
        cancelled_by_host(r);
    } else if (g_extension->cancel != NULL && !(g_conformance && r->item_count > 0 && r->items[0].title
                                                && strcmp(r->items[0].title, "sdkhost.conformance") == 0)) {
        g_extension->cancel(r, g_extension->context);
    }
    request_unref(r);
}

static void handle_credit(incoming *in) {
    const char *id = need_id(in);
    int64_t count = need_integer(in, "count");
    sdkhost_request *r = registry_find(id);
    if (r == NULL) return;
    pthread_mutex_lock(&r->lock);
    int64_t credits = r->credits + (count > 0 ? (count > SDKHOST_STREAM_WINDOW ? SDKHOST_STREAM_WINDOW : count) : 0);
    r->credits = credits > SDKHOST_STREAM_WINDOW ? SDKHOST_STREAM_WINDOW : (int)credits;
    pthread_cond_broadcast(&r->changed);
    pthread_mutex_unlock(&r->lock);
    request_unref(r);
}

static void handle_ping(incoming *in) {
    int64_t seq = need_integer(in, "seq");
    arena a = {0};
    sdkhost_value m = view_message(&a, "pong", NULL, 1);
    view_set(&m, "seq", sdkhost_integer(seq));
    send_value(&m);
    arena_free(&a);
}

static void handle_call_answer(incoming *in, bool result) {
    need_id(in);
    int64_t call = need_integer(in, "call");
    sdkhost_call_result outcome;
    memset(&outcome, 0, sizeof outcome);
    if (result) {
        outcome.status = SDKHOST_CALL_RESULT;
        outcome.items = need_items(in, &outcome.item_count);
    } else {
        outcome.status = SDKHOST_CALL_ERROR;
        need_error(in, &outcome.error);
    }
    pending_call *p = calls_take(call, NULL);
    if (p == NULL) {
        sdkhost_call_result_free(&outcome);  /* for a call no longer waited for: dropped */
        return;
    }
    resolve(p, &outcome);
}

/* Checks the fields of a message type the worker does not expect (Message(plist:) throws for these too). */
static void check_other(incoming *in) {
    const char *t = in->type;
    if (strcmp(t, "welcome") == 0) { need_integer(in, "pid"); need_integer(in, "version"); need_string(in, "identifier"); }
    else if (strcmp(t, "complete") == 0 || strcmp(t, "partial") == 0) { size_t n; need_id(in); sdkhost_items_free(need_items(in, &n), n); }
    else if (strcmp(t, "cancelled") == 0) { need_error(in, NULL); need_id(in); }
    else if (strcmp(t, "pong") == 0 || strcmp(t, "status") == 0) need_integer(in, "seq");
    else if (strcmp(t, "connect") == 0) { need_integer(in, "version"); optional_of_kind(in, "app", SDKHOST_STRING, "a string"); }
    else if (strcmp(t, "prewarm") == 0) { need_id(in); need_string(in, "extension"); }
    else if (strcmp(t, "prewarmed") == 0 || strcmp(t, "assigned") == 0) { need_integer(in, "pid"); need_id(in); }
    else if (strcmp(t, "connected") == 0) {
        need_integer(in, "pid"); need_integer(in, "version"); need_strings(in, "extensions", false);
        sdkhost_value *points = field(in->root, "points");
        if (points != NULL) {
            if (points->kind != SDKHOST_DICTIONARY) protocol_error("'connected' points is a %s, not a dictionary", kind_name(points));
            for (size_t i = 0; i < points->u.dictionary.count; i++)
                if (points->u.dictionary.entries[i].value.kind != SDKHOST_STRING) protocol_error("'connected' points must be strings");
        }
    }
    else if (strcmp(t, "sandboxed") == 0) { need_strings(in, "layers", false); need_strings(in, "skipped", false); need_strings(in, "timings", true); }
    else if (strcmp(t, "launchFailed") == 0) need_string(in, "reason");
    else if (strcmp(t, "interrupted") == 0) { if (!field(in->root, "reason")) protocol_error("'interrupted' needs a 'reason'"); need_id(in); }
    else if (strcmp(t, "statusReport") == 0) { if (!field(in->root, "report")) protocol_error("'statusReport' needs a 'report'"); need_integer(in, "seq"); }
    else if (strcmp(t, "leak") == 0) { need_id(in); need_strings(in, "alive", false); need_integer(in, "afterMs"); }
    else if (strcmp(t, "event") == 0) {
        sdkhost_value *event = field(in->root, "event");
        if (event == NULL || event->kind != SDKHOST_DICTIONARY) protocol_error("'event' needs a dictionary 'event'");
    }
    else if (strcmp(t, "hostCall") == 0) { size_t n; need_id(in); need_integer(in, "call"); need_string(in, "service"); sdkhost_items_free(need_items(in, &n), n); }
    else if (strcmp(t, "hostCallCancel") == 0) { need_id(in); need_integer(in, "call"); }
}

static const char *const known_types[] = {"hello", "welcome", "begin", "complete", "partial", "credit", "cancel",
    "cancelled", "ping", "pong", "error", "connect", "connected", "assigned", "interrupted", "status", "statusReport",
    "sandboxed", "launchFailed", "prewarm", "prewarmed", "leak", "subscribe", "event", "hostCall", "hostCallResult",
    "hostCallError", "hostCallCancel"};

static void handle_payload(const uint8_t *payload, size_t length) {
    sdkhost_value root;
    char why[300];
    if (sdkhost_plist_decode(payload, length, &root, why, sizeof why) != 0) protocol_error("bad frame: %s", why);
    incoming in;
    memset(&in, 0, sizeof in);
    in.root = &root;
    if (root.kind != SDKHOST_DICTIONARY) protocol_error("message is a %s, not a dictionary", kind_name(&root));
    sdkhost_value *type = field(&root, "type");
    if (type == NULL || type->kind != SDKHOST_STRING) protocol_error("message has no string 'type'");
    in.type = type->u.string.bytes;
    bool known = false;
    for (size_t i = 0; i < sizeof known_types / sizeof known_types[0]; i++)
        if (strcmp(in.type, known_types[i]) == 0 && type->u.string.length == strlen(known_types[i])) known = true;

    /* The frame's descriptors: the first `fds` in the queue. */
    sdkhost_value *fds = field(&root, "fds");
    if (fds != NULL) {
        if (fds->kind != SDKHOST_INTEGER || fds->u.integer < 0) protocol_error("'fds' must be a non-negative integer");
        if (fds->u.integer > SDKHOST_MAX_FILES_PER_MESSAGE)
            protocol_error("message carries %lld descriptors; at most %d are allowed", (long long)fds->u.integer, SDKHOST_MAX_FILES_PER_MESSAGE);
        size_t n = (size_t)fds->u.integer;
        if (n > g_queue_count) protocol_error("the frame says it carries %zu descriptor(s), and %zu arrived", n, g_queue_count);
        memcpy(in.claimed, g_queue, n * sizeof(int));
        memmove(g_queue, g_queue + n, (g_queue_count - n) * sizeof(int));
        g_queue_count -= n;
        in.claimed_count = n;
        bool may_carry = strcmp(in.type, "begin") == 0 || strcmp(in.type, "complete") == 0 || strcmp(in.type, "partial") == 0
            || strcmp(in.type, "hostCall") == 0 || strcmp(in.type, "hostCallResult") == 0;
        if (n > 0 && (!may_carry || !known)) {
            char shown[128];
            protocol_error("'%s' cannot carry descriptors", printable(in.type, type->u.string.length, shown));
        }
    }

    if (!known) {
        char shown[128];
        sdkhost_log("unknown message type '%s' from host; ignored", printable(in.type, type->u.string.length, shown));
    } else if (strcmp(in.type, "hello") == 0) handle_hello(&in);
    else if (strcmp(in.type, "begin") == 0) handle_begin(&in);
    else if (strcmp(in.type, "cancel") == 0) handle_cancel(&in);
    else if (strcmp(in.type, "credit") == 0) handle_credit(&in);
    else if (strcmp(in.type, "ping") == 0) handle_ping(&in);
    else if (strcmp(in.type, "hostCallResult") == 0) handle_call_answer(&in, true);
    else if (strcmp(in.type, "hostCallError") == 0) handle_call_answer(&in, false);
    else if (strcmp(in.type, "error") == 0) {
        sdkhost_value *message = field(&root, "message");
        if (message == NULL || message->kind != SDKHOST_STRING) missing(&in, "a string", "message");
        if (field(&root, "id") != NULL) need_id(&in);
        char shown[128];
        sdkhost_log("host reported: %s", printable(message->u.string.bytes, message->u.string.length, shown));
    } else if (strcmp(in.type, "subscribe") != 0) {
        check_other(&in);
        sdkhost_log("unexpected '%s' from host; ignored", in.type);
    } else {
        sdkhost_log("unexpected '%s' from host; ignored", in.type);
    }
    for (size_t i = 0; i < in.claimed_count; i++)
        if (!in.taken[i]) close(in.claimed[i]);
    sdkhost_value_free(&root);
}

/* MARK: The reader loop */

/* Links the host's exit-notice page into this (the main) thread's robust-futex list, so the host learns of the
 * process's death before the kernel tears its memory down (Sources/SDKPosix/ExitNotice.swift). */
struct robust_entry { struct robust_entry *next; };
struct robust_head { struct robust_entry list; long futex_offset; struct robust_entry *pending; };

static void register_exit_notice(int fd) {
    const size_t page_size = 4096;
    void *page = mmap(NULL, page_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = page == MAP_FAILED ? errno : 0;
    close(fd);
    if (e) {
        sdkhost_log("exit notice unavailable: %s", strerror(e));
        return;
    }
    static struct robust_head own;
    struct robust_head *head = NULL;
    size_t length = 0;
    if (syscall(SYS_get_robust_list, 0, &head, &length) != 0 || head == NULL) {
        /* glibc registers a list for every thread it starts; a program without one gets ours. */
        own.list.next = &own.list;
        own.futex_offset = -(long)sizeof(uint64_t);
        own.pending = NULL;
        if (syscall(SYS_set_robust_list, &own, sizeof own) != 0) e = errno;
        head = &own;
    }
    /* The kernel finds each entry's word at entry + futex_offset: the entry goes that far after the word. */
    long entry_at = -head->futex_offset;
    if (e == 0 && (entry_at < (long)sizeof(uint32_t) || entry_at > (long)(page_size - sizeof(void *))
                   || entry_at % (long)sizeof(void *) != 0))
        e = EINVAL;
    if (e) {
        munmap(page, page_size);
        sdkhost_log("exit notice unavailable: %s", strerror(e));
        return;
    }
    uint32_t *word = page;
    struct robust_entry *entry = (struct robust_entry *)((char *)page + entry_at);
    __atomic_store_n(word, (uint32_t)syscall(SYS_gettid), __ATOMIC_SEQ_CST);
    entry->next = head->list.next;
    __atomic_store_n(&head->list.next, entry, __ATOMIC_RELEASE);
}

static bool parse_int64(const char *s, int64_t *out) {
    if (s == NULL || *s == 0) return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || *end != 0) return false;
    *out = v;
    return true;
}

static void read_environment(void) {
    if (g_env_read) return;
    g_env_read = true;
    int64_t v;
    if (parse_int64(getenv("SDKHOST_IPC_FD"), &v) && v >= 0 && v <= INT_MAX) g_fd = (int)v;
    const char *id = getenv("SDKHOST_EXTENSION_ID");
    if (id) snprintf(g_identifier, sizeof g_identifier, "%s", id);
    if (parse_int64(getenv("SDKHOST_IDLE_TIMEOUT_MS"), &v)) g_idle_ms = v;
    if (parse_int64(getenv("SDKHOST_LEAK_CHECK_MS"), &v) && v > 0) g_leak_ms = v;
    if (parse_int64(getenv("SDKHOST_MAX_HOST_CALLS"), &v)) g_max_calls = v >= 1 && v <= 1024 ? (int)v : 16;
    const char *conformance = getenv("SDKHOST_CONFORMANCE");
    g_conformance = conformance != NULL && strcmp(conformance, "1") == 0;
}

const char *sdkhost_extension_id(void) {
    read_environment();
    return g_identifier;
}

int sdkhost_host_fd(void) {
    read_environment();
    return g_fd;
}

void sdkhost_run(const sdkhost_extension *extension) {
    read_environment();
    g_pid = getpid();
    g_extension = extension;
    signal(SIGPIPE, SIG_IGN);
    /* stdout is a pipe to the host: one line at a time, so each printed line reaches the host log as printed. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct stat st;
    if (fstat(g_fd, &st) != 0) {
        sdkhost_log("no host connection on fd %d: this program is an sdk-host extension; run it through sdk-host", g_fd);
        exit(64);
    }
    if (extension == NULL || extension->begin == NULL) {
        sdkhost_log("sdkhost_run needs an extension with a begin handler");
        exit(70);
    }
    int64_t notice;
    if (parse_int64(getenv("SDKHOST_EXIT_NOTICE_FD"), &notice) && notice > 2 && notice <= INT_MAX)
        register_exit_notice((int)notice);
    g_reader = pthread_self();
    g_running = true;
    g_last_begin = monotonic_ns();

    uint8_t *buffer = NULL;
    size_t start = 0, end = 0, capacity = 0;
    uint8_t chunk[READ_CHUNK];
    uint64_t next_leak_check = g_last_begin;
    for (;;) {
        struct pollfd p = {.fd = g_fd, .events = POLLIN};
        int timeout = g_idle_ms > 0 && g_idle_ms < 1000 ? (int)g_idle_ms : 1000;
        if (g_leak_ms > 0 && timeout > 250) timeout = 250;
        int ready = poll(&p, 1, timeout);
        if (g_leak_ms > 0 && monotonic_ns() >= next_leak_check) {
            next_leak_check = monotonic_ns() + 250000000u;
            check_leaks();
        }
        if (ready < 0) {
            if (errno == EINTR) continue;
            sdkhost_log("poll failed: %s", strerror(errno));
            exit(1);
        }
        if (ready == 0) {
            /* The idle backstop: twice the host's idle timeout (the host retires idle workers itself first). */
            if (g_idle_ms > 0 && active_count() == 0 && monotonic_ns() - g_last_begin > (uint64_t)g_idle_ms * 2000000u) exit(0);
            continue;
        }
        union {
            char bytes[CMSG_SPACE(sizeof(int) * SDKHOST_MAX_FILES_PER_MESSAGE)];
            struct cmsghdr align;
        } control;
        struct iovec iov = {.iov_base = chunk, .iov_len = sizeof chunk};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.bytes, .msg_controllen = sizeof control.bytes};
        ssize_t n = recvmsg(g_fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        bool truncated = n >= 0 && (msg.msg_flags & MSG_CTRUNC) != 0;
        const char *problem = NULL;
        if (n >= 0) {
            for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
                if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
                    truncated = true;
                    continue;
                }
                size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (size_t i = 0; i < count; i++) {
                    int fd;
                    memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                    if (problem == NULL) problem = refused_on_receipt(fd);
                    queue_push(fd);
                }
            }
        }
        if (truncated) protocol_error("a message brought more than %d descriptors, or control data other than descriptors", SDKHOST_MAX_FILES_PER_MESSAGE);
        if (problem) protocol_error("a descriptor attachment is %s", problem);
        if (n <= 0) exit(0);  /* the host closed the connection (or it failed) */

        /* Append, compacting first when what was consumed is the larger part. */
        if (start == end) {
            start = end = 0;
            if (capacity > RETAINED_BUFFER) {
                free(buffer);
                buffer = NULL;
                capacity = 0;
            }
        } else if (start > 4096 && start * 2 > end) {
            memmove(buffer, buffer + start, end - start);
            end -= start;
            start = 0;
        }
        if (capacity - end < (size_t)n) {
            size_t wanted = capacity ? capacity : READ_CHUNK;
            while (wanted - end < (size_t)n) wanted *= 2;
            buffer = xrealloc_array(buffer, wanted, 1);
            capacity = wanted;
        }
        memcpy(buffer + end, chunk, (size_t)n);
        end += (size_t)n;

        while (end - start >= 4) {
            uint32_t length = (uint32_t)read_be(buffer + start, 4);
            if (length > SDKHOST_MAX_FRAME_BYTES)
                protocol_error("bad frame: frameTooLarge: frame declares %u bytes; the limit is %u", length, SDKHOST_MAX_FRAME_BYTES);
            if (end - start - 4 < length) break;
            size_t at = start + 4;
            start = at + length;
            handle_payload(buffer + at, length);
        }
        /* Descriptors come with their frame's first byte: with no frame half-read none may be left, and a
         * half-read frame has at most one message's worth. */
        if (g_queue_count > (end > start ? SDKHOST_MAX_FILES_PER_MESSAGE : 0))
            protocol_error("%zu descriptor(s) arrived that no frame claims", g_queue_count);
    }
}
