/* CrasherC (com.example.crasher-c): the C port of the crash-injection extension (Extensions/Crasher), built on
 * the C runtime (Extensions/CRuntime). The first input item's title (or its first string attachment) picks the
 * fault, default echo; every fault is real: a real signal, a real exit, real garbage on the wire. Each one's
 * outcome as the host reports it is the Swift Crasher's. */
#define _GNU_SOURCE
#include "sdkhost.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define DOMAIN "com.example.crasher-c"

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {}
}

static _Noreturn void sleep_forever(void) {
    for (;;) sleep(60);
}

/* Writes bytes straight to the host connection, past the runtime (and its lock). */
static void write_raw(const void *bytes, size_t length) {
    const char *p = bytes;
    while (length > 0) {
        ssize_t n = write(sdkhost_host_fd(), p, length);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        p += n;
        length -= (size_t)n;
    }
}

/* Half a frame, past the runtime: a header promising 100 bytes, then 10 of them. */
static void write_half_frame(void) {
    static const char partial[] = "\0\0\0\x64" "bplist00xx";
    write_raw(partial, sizeof partial - 1);
}

/* A random version-4 UUID, for a request id the host never sent. */
static void random_id(char out[37]) {
    unsigned char b[16];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
        unsigned long long t = (unsigned long long)time(NULL) ^ ((unsigned long long)getpid() << 32);
        for (int i = 0; i < 16; i++) b[i] = (unsigned char)(t >> (8 * (i % 8))) ^ (unsigned char)(i * 37);
    }
    b[6] = (unsigned char)((b[6] & 0x0F) | 0x40);
    b[8] = (unsigned char)((b[8] & 0x3F) | 0x80);
    snprintf(out, 37, "%02X%02X%02X%02X-%02X%02X-%02X%02X-%02X%02X-%02X%02X%02X%02X%02X%02X", b[0], b[1], b[2], b[3],
             b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

/* One item {title, attachments: [], userInfo: {}} as a wire value. */
static sdkhost_value item_value(const char *title) {
    sdkhost_value item = sdkhost_dictionary();
    sdkhost_dictionary_set(&item, "attachments", sdkhost_array());
    sdkhost_dictionary_set(&item, "userInfo", sdkhost_dictionary());
    if (title) sdkhost_dictionary_set(&item, "title", sdkhost_string(title));
    return item;
}

/* A forged message {type, id, items: [{title}]} (no items when `title` is NULL) appended as a frame to `out`. */
static void append_forged(const char *type, const char *id, const char *title, char **out, size_t *length) {
    sdkhost_value m = sdkhost_dictionary();
    sdkhost_dictionary_set(&m, "type", sdkhost_string(type));
    sdkhost_dictionary_set(&m, "id", sdkhost_string(id));
    sdkhost_value items = sdkhost_array();
    if (title) sdkhost_array_append(&items, item_value(title));
    sdkhost_dictionary_set(&m, "items", items);
    uint8_t *frame;
    size_t n;
    if (sdkhost_frame_encode(&m, &frame, &n) == 0) {
        *out = realloc(*out, *length + n);
        if (*out == NULL) abort();
        memcpy(*out + *length, frame, n);
        *length += n;
        free(frame);
    }
    sdkhost_value_free(&m);
}

/* Writes `m` as one frame, raw, and frees it. */
static void write_message(sdkhost_value *m) {
    uint8_t *frame;
    size_t n;
    if (sdkhost_frame_encode(m, &frame, &n) == 0) {
        write_raw(frame, n);
        free(frame);
    }
    sdkhost_value_free(m);
}

static void write_forged(const char *type, const char *id, const char *title) {
    char *frames = NULL;
    size_t length = 0;
    append_forged(type, id, title, &frames, &length);
    write_raw(frames, length);
    free(frames);
}

static void complete_titled(sdkhost_request *request, const char *title) {
    sdkhost_item item = sdkhost_item_make(title, NULL);
    sdkhost_complete_request(request, &item, 1);
    sdkhost_item_free(&item);
}

static void echo(sdkhost_request *request) {
    size_t count;
    const sdkhost_item *items = sdkhost_request_items(request, &count);
    sdkhost_complete_request(request, items, count);
}

static bool has_prefix(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

static long number_after(const char *s, long fallback) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    return errno != 0 || end == s || *end != 0 || v < 0 ? fallback : v;
}

static void begin(sdkhost_request *request, void *context) {
    (void)context;
    size_t count;
    const sdkhost_item *items = sdkhost_request_items(request, &count);
    const char *command = "echo";
    if (count > 0) {
        if (items[0].title != NULL) {
            command = items[0].title;
        } else if (items[0].attachments.kind == SDKHOST_ARRAY && items[0].attachments.u.array.count > 0
                   && items[0].attachments.u.array.elements[0].kind == SDKHOST_STRING) {
            command = items[0].attachments.u.array.elements[0].u.string.bytes;
        }
    }

    if (strcmp(command, "segv") == 0) {
        volatile uintptr_t address = 0x8;
        *(volatile int *)address = 1;
    } else if (strcmp(command, "abort") == 0) {
        abort();
    } else if (strcmp(command, "range") == 0) {
        /* Swift's index-out-of-range check traps (ud2, SIGILL on x86-64): the same instruction here. */
        __builtin_trap();
    } else if (strcmp(command, "exit") == 0) {
        exit(7);
    } else if (strcmp(command, "kill") == 0) {
        kill(getpid(), SIGKILL);
    } else if (strcmp(command, "hang") == 0) {
        /* Ignores cancellation on purpose: the host must kill us. */
        sleep_forever();
    } else if (strcmp(command, "garbage") == 0) {
        static const char junk[] = "\0\0\0\x0cnot a bplist";
        write_raw(junk, sizeof junk - 1);
        sleep_forever();
    } else if (strcmp(command, "oversize") == 0) {
        /* A frame header claiming 1 GiB: the host must reject it before reading or allocating the payload. */
        static const unsigned char header[] = {0x40, 0, 0, 0};
        write_raw(header, sizeof header);
        sleep_forever();
    } else if (strcmp(command, "truncate") == 0) {
        /* Half a frame (a header promising 100 bytes, then 10), then exit: a protocol violation, not an exit. */
        write_half_frame();
        exit(0);
    } else if (strcmp(command, "truncate-linger") == 0) {
        /* Half a frame, then the socket shut for writing, and the worker lives on: a truncated frame. */
        write_half_frame();
        shutdown(sdkhost_host_fd(), SHUT_WR);
        sleep_forever();
    } else if (strcmp(command, "truncate-segv") == 0) {
        /* Half a frame, then a crash: the signal is the cause, not the frame it cut short. */
        write_half_frame();
        volatile uintptr_t address = 0x8;
        *(volatile int *)address = 1;
    } else if (strcmp(command, "unknownid") == 0) {
        char id[37];
        random_id(id);
        write_forged("complete", id, NULL);
        sleep_forever();
    } else if (has_prefix(command, "stream-abort:")) {
        /* N partial results, then a crash: the host hands all N to the app, then the interruption. */
        long n = number_after(command + 13, 1);
        char title[40];
        for (long i = 0; i < n; i++) {
            snprintf(title, sizeof title, "partial %ld", i);
            sdkhost_item item = sdkhost_item_make(title, NULL);
            sdkhost_send_partial(request, &item, 1);
            sdkhost_item_free(&item);
        }
        abort();
    } else if (strcmp(command, "flood") == 0) {
        /* 40 partial results in one write, ignoring the host's credit: a protocol violation, not a buffer. */
        char *frames = NULL, title[40];
        size_t length = 0;
        for (int i = 0; i < 40; i++) {
            snprintf(title, sizeof title, "flood %d", i);
            append_forged("partial", sdkhost_request_id(request), title, &frames, &length);
        }
        write_raw(frames, length);
        free(frames);
        sleep_forever();
    } else if (strcmp(command, "cancel") == 0) {
        sdkhost_cancel_request(request, DOMAIN, 42, "cancelled by the extension on request");
    } else if (strcmp(command, "double") == 0) {
        /* The first and a duplicate go out raw, in one write, before the runtime's own completion (which is then
         * third, and dropped by the host too); a second completeRequest is the runtime's logged no-op. */
        char *frames = NULL;
        size_t length = 0;
        append_forged("complete", sdkhost_request_id(request), "first", &frames, &length);
        append_forged("complete", sdkhost_request_id(request), "duplicate", &frames, &length);
        write_raw(frames, length);
        free(frames);
        complete_titled(request, "first");
        complete_titled(request, "second");
    } else if (has_prefix(command, "slow:")) {
        long ms = number_after(command + 5, 100);
        for (long waited = 0; waited < ms; waited += 10) {
            if (sdkhost_request_is_cancelled(request)) {
                sdkhost_cancel_request(request, "SDKHost", 1, "cancelled by the host");
                return;
            }
            sleep_ms(10);
        }
        echo(request);
    } else if (has_prefix(command, "alloc:")) {
        /* Allocates and touches <MB> megabytes: past MemoryLimitMB the allocation fails and we abort, as the
         * Swift runtime traps on a failed allocation. */
        long megabytes = number_after(command + 6, 64), got = 0;
        char **chunks = calloc((size_t)megabytes + 1, sizeof(char *));
        if (chunks == NULL) abort();
        for (; got < megabytes; got++) {
            chunks[got] = malloc(1u << 20);
            if (chunks[got] == NULL) {
                fputs("crasher-c: could not allocate memory\n", stderr);
                abort();
            }
            memset(chunks[got], 1, 1u << 20);
        }
        char title[64];
        snprintf(title, sizeof title, "allocated %ld MB", got);
        for (long i = 0; i < got; i++) free(chunks[i]);
        free(chunks);
        complete_titled(request, title);
    } else if (has_prefix(command, "bigreply:")) {
        /* An attachment of <MB> megabytes: past the frame limit the runtime cannot send it and cancels. */
        long megabytes = number_after(command + 9, 17);
        size_t size = (size_t)megabytes << 20;
        uint8_t *bytes = malloc(size ? size : 1);
        if (bytes == NULL) abort();
        memset(bytes, 7, size);
        sdkhost_item item = sdkhost_item_make(NULL, NULL);
        sdkhost_item_add_attachment(&item, sdkhost_data(bytes, size));
        free(bytes);
        sdkhost_complete_request(request, &item, 1);
        sdkhost_item_free(&item);
    } else if (strcmp(command, "deepreply") == 0) {
        /* A reply nested past the frame's 512 levels: no frame can hold it, and the runtime says so. */
        sdkhost_value deep = sdkhost_array();
        for (int i = 0; i < 520; i++) {
            sdkhost_value outer = sdkhost_array();
            sdkhost_array_append(&outer, deep);
            deep = outer;
        }
        sdkhost_item item = sdkhost_item_make(NULL, NULL);
        sdkhost_item_add_attachment(&item, deep);
        sdkhost_complete_request(request, &item, 1);
        sdkhost_item_free(&item);
    } else if (strcmp(command, "stall") == 0) {
        /* Half a frame on the connection, then stopped: wedged mid-frame, it can answer nothing. */
        write_half_frame();
        kill(getpid(), SIGSTOP);
    } else if (strcmp(command, "stop") == 0) {
        /* Stops itself: it answers nothing, heartbeats included, and cannot honour a cancel. */
        kill(getpid(), SIGSTOP);
    } else if (has_prefix(command, "print:")) {
        /* Plain stdout, then complete: the line must reach the host log although stdout is a pipe. */
        printf("%s\n", command + 6);
        echo(request);
    } else if (has_prefix(command, "env:")) {
        const char *value = getenv(command + 4);
        complete_titled(request, value ? value : "(unset)");
    } else if (strcmp(command, "stderr") == 0) {
        /* Writes to stderr, then crashes: the crash report must carry the text. */
        static const char text[] = "crasher: about to abort on request\n";
        ssize_t unused = write(2, text, sizeof text - 1);
        (void)unused;
        abort();
    } else if (strcmp(command, "hoard") == 0) {
        /* Keeps every request for good, in a global list: an SDK that caches what it should not, which the
         * runtime's leak check reports. */
        static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
        static sdkhost_request **hoard;
        static size_t hoarded;
        pthread_mutex_lock(&lock);
        sdkhost_request **grown = realloc(hoard, (hoarded + 1) * sizeof *hoard);
        if (grown == NULL) abort();
        hoard = grown;
        sdkhost_request_retain(request);
        hoard[hoarded++] = request;
        pthread_mutex_unlock(&lock);
        echo(request);
    } else if (has_prefix(command, "call:")) {
        /* One blocking host call to service NAME with the input's items; completes with its answer. */
        sdkhost_call_result result;
        switch (sdkhost_call_host(request, command + 5, items, count, &result)) {
        case SDKHOST_CALL_RESULT: sdkhost_complete_request(request, result.items, result.item_count); break;
        case SDKHOST_CALL_ERROR:
            sdkhost_cancel_request(request, result.error.domain, result.error.code, result.error.message);
            break;
        case SDKHOST_CALL_CANCELLED: sdkhost_cancel_request(request, "SDKHost", 1, "cancelled by the host"); break;
        }
        sdkhost_call_result_free(&result);
    } else {  /* "echo" and anything unknown */
        echo(request);
    }
}

/* CRASHER_FAULT_AT_START, as the Swift Crasher: `abort` dies before the handshake, `abort-while:<path>` only
 * while that file exists, `sleep:<ms>` starts slowly, `welcome-v1` answers as an old SDK would, `call-early`
 * makes a host call before any request. */
static void fault_at_start(void) {
    const char *fault = getenv("CRASHER_FAULT_AT_START");
    if (fault == NULL) return;
    if (strcmp(fault, "abort") == 0) abort();
    if (has_prefix(fault, "abort-while:") && access(fault + 12, F_OK) == 0) abort();
    if (strcmp(fault, "welcome-v1") == 0) {
        sdkhost_value m = sdkhost_dictionary();
        sdkhost_dictionary_set(&m, "type", sdkhost_string("welcome"));
        sdkhost_dictionary_set(&m, "version", sdkhost_integer(1));
        sdkhost_dictionary_set(&m, "identifier", sdkhost_string("com.example.crasher-c"));
        sdkhost_dictionary_set(&m, "pid", sdkhost_integer(getpid()));
        write_message(&m);
    }
    if (strcmp(fault, "call-early") == 0) {
        char id[37];
        random_id(id);
        sdkhost_value m = sdkhost_dictionary();
        sdkhost_dictionary_set(&m, "type", sdkhost_string("hostCall"));
        sdkhost_dictionary_set(&m, "id", sdkhost_string(id));
        sdkhost_dictionary_set(&m, "call", sdkhost_integer(1));
        sdkhost_dictionary_set(&m, "service", sdkhost_string("document.part"));
        sdkhost_dictionary_set(&m, "items", sdkhost_array());
        write_message(&m);
    }
    if (has_prefix(fault, "sleep:")) sleep_ms(number_after(fault + 6, 0));
}

int main(void) {
    fault_at_start();
    static const sdkhost_extension crasher = {.begin = begin, .cancel = NULL, .context = NULL};
    sdkhost_run(&crasher);
}
