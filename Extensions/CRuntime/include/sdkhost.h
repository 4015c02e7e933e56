/* sdkhost.h: the C runtime for sdk-host extensions (docs/C-RUNTIME.md).
 *
 * An extension is an executable whose main() calls sdkhost_run() with a handler. The runtime owns the host
 * connection: it answers the handshake and heartbeats, runs each request's handler on a thread of its own,
 * delivers cancels and credit, passes files as descriptors, makes calls to the app's host services, and exits
 * when the host goes away. The wire protocol it speaks is docs/PROTOCOL.md.
 *
 * C11 and libc only (with pthreads). Build an extension with:
 *     cc -std=c11 -O2 -pthread -I <dir of this header> -o MyExt my.c sdkhost.c
 *
 * Ownership, in one rule: a function that takes a value or an item BY VALUE takes ownership of it (the caller
 * must not free it afterwards); a function that takes a POINTER only borrows it. Allocation failure inside the
 * runtime is fatal (it logs and aborts), as it is in the Swift runtime.
 */
#ifndef SDKHOST_H
#define SDKHOST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define SDKHOST_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define SDKHOST_PRINTF(f, a)
#endif

#ifdef __cplusplus
#define SDKHOST_NORETURN [[noreturn]]
#else
#define SDKHOST_NORETURN _Noreturn
#endif

/* MARK: Values */

/** The kind of a property-list value: what `sdkhost_value.kind` says its union holds. */
typedef enum sdkhost_kind {
    SDKHOST_NONE = 0,   /**< No value: a zero-initialised or freed value. Never sent (encoding it fails). */
    SDKHOST_STRING,     /**< `u.string`: UTF-8 bytes and their length, NUL-terminated (may hold NULs). */
    SDKHOST_INTEGER,    /**< `u.integer`: a signed 64-bit integer. */
    SDKHOST_REAL,       /**< `u.real`: a double. */
    SDKHOST_BOOL,       /**< `u.boolean`. */
    SDKHOST_DATE,       /**< `u.date`: seconds since 2001-01-01 00:00:00 UTC, as property lists store it. */
    SDKHOST_DATA,       /**< `u.data`: bytes and their length. */
    SDKHOST_ARRAY,      /**< `u.array`: `count` elements. */
    SDKHOST_DICTIONARY  /**< `u.dictionary`: `count` entries with string keys, in no particular order. */
} sdkhost_kind;

typedef struct sdkhost_value sdkhost_value;
typedef struct sdkhost_entry sdkhost_entry;

/** A property-list value: a tagged union. Build one with the constructors below; read it through `kind` and `u`.
 *  A value owns everything it points to; free it with sdkhost_value_free(). */
struct sdkhost_value {
    /** Which member of `u` is valid. */
    sdkhost_kind kind;
    /** The payload for `kind`. */
    union {
        /** SDKHOST_STRING: UTF-8, `bytes[length] == 0`. */
        struct { char *bytes; size_t length; } string;
        /** SDKHOST_INTEGER. */
        int64_t integer;
        /** SDKHOST_REAL. */
        double real;
        /** SDKHOST_BOOL. */
        bool boolean;
        /** SDKHOST_DATE: seconds since 2001-01-01 00:00:00 UTC (add 978307200 for the Unix epoch). */
        double date;
        /** SDKHOST_DATA (`bytes` may be NULL when `length` is 0). */
        struct { uint8_t *bytes; size_t length; } data;
        /** SDKHOST_ARRAY (`capacity` is the runtime's bookkeeping). */
        struct { sdkhost_value *elements; size_t count, capacity; } array;
        /** SDKHOST_DICTIONARY (`capacity` is the runtime's bookkeeping). */
        struct { sdkhost_entry *entries; size_t count, capacity; } dictionary;
    } u;
};

/** One entry of a dictionary: a UTF-8 key (NUL-terminated, `key_length` bytes) and its value. */
struct sdkhost_entry {
    /** The key's bytes. */
    char *key;
    /** The key's length in bytes. */
    size_t key_length;
    /** The value. */
    sdkhost_value value;
};

/** A string value holding a copy of the NUL-terminated UTF-8 string `s`. */
sdkhost_value sdkhost_string(const char *s);
/** A string value holding a copy of `length` bytes of UTF-8 at `s` (which may contain NULs). */
sdkhost_value sdkhost_string_n(const char *s, size_t length);
/** An integer value. */
sdkhost_value sdkhost_integer(int64_t i);
/** A real value. */
sdkhost_value sdkhost_real(double d);
/** A boolean value. */
sdkhost_value sdkhost_bool(bool b);
/** A date value: `seconds` since 2001-01-01 00:00:00 UTC. */
sdkhost_value sdkhost_date(double seconds);
/** A data value holding a copy of `length` bytes at `bytes`. */
sdkhost_value sdkhost_data(const void *bytes, size_t length);
/** An empty array. */
sdkhost_value sdkhost_array(void);
/** An empty dictionary. */
sdkhost_value sdkhost_dictionary(void);

/** Appends `element` to `array`, taking ownership of it.
 *  @return 0, or -1 (and `element` is freed) when `array` is not an array. */
int sdkhost_array_append(sdkhost_value *array, sdkhost_value element);

/** Sets `dictionary[key]` (a NUL-terminated key) to `value`, taking ownership of it; an old value is freed.
 *  @return 0, or -1 (and `value` is freed) when `dictionary` is not a dictionary. */
int sdkhost_dictionary_set(sdkhost_value *dictionary, const char *key, sdkhost_value value);

/** As sdkhost_dictionary_set(), with a key of `key_length` bytes. */
int sdkhost_dictionary_set_n(sdkhost_value *dictionary, const char *key, size_t key_length, sdkhost_value value);

/** The value for the NUL-terminated `key`, or NULL when there is none or `dictionary` is not a dictionary.
 *  The pointer is borrowed: valid until the dictionary changes. */
const sdkhost_value *sdkhost_dictionary_get(const sdkhost_value *dictionary, const char *key);

/** The string's bytes when `value` is a string, else NULL. Borrowed. */
const char *sdkhost_value_string(const sdkhost_value *value);

/** A deep copy of `value`. */
sdkhost_value sdkhost_value_copy(const sdkhost_value *value);

/** Whether two values are equal: same kind and contents, dictionaries in any order, NaN equal to NaN. */
bool sdkhost_value_equal(const sdkhost_value *a, const sdkhost_value *b);

/** Frees what `value` holds and leaves it SDKHOST_NONE. NULL and SDKHOST_NONE are no-ops. */
void sdkhost_value_free(sdkhost_value *value);

/* MARK: Items */

/** One unit of input or output, NSExtensionItem's shape: {title?, text?, attachments, userInfo, files?}.
 *  An item owns its strings, values and descriptors; sdkhost_item_free() frees and closes them. */
typedef struct sdkhost_item {
    /** The title (UTF-8, NUL-terminated), or NULL when absent. */
    char *title;
    /** The title's length in bytes. */
    size_t title_length;
    /** The text (UTF-8, NUL-terminated), or NULL when absent. */
    char *text;
    /** The text's length in bytes. */
    size_t text_length;
    /** The payload values: always an SDKHOST_ARRAY. */
    sdkhost_value attachments;
    /** Anything else the two sides agree on: always an SDKHOST_DICTIONARY. */
    sdkhost_value user_info;
    /** Open read-only files, passed to and from the host as descriptors (at most 64 per message). */
    int *files;
    /** How many descriptors `files` holds. */
    size_t file_count;
    /** The runtime's bookkeeping. */
    size_t file_capacity;
} sdkhost_item;

/** A new item with copies of `title` and `text` (either may be NULL: absent), no attachments, an empty
 *  userInfo and no files. */
sdkhost_item sdkhost_item_make(const char *title, const char *text);

/** Replaces the item's title with a copy of `title` (NULL: none). */
void sdkhost_item_set_title(sdkhost_item *item, const char *title);

/** Replaces the item's text with a copy of `text` (NULL: none). */
void sdkhost_item_set_text(sdkhost_item *item, const char *text);

/** Appends `value` to the item's attachments, taking ownership of it. */
void sdkhost_item_add_attachment(sdkhost_item *item, sdkhost_value value);

/** Sets `userInfo[key]` to `value`, taking ownership of it. */
void sdkhost_item_set_user_info(sdkhost_item *item, const char *key, sdkhost_value value);

/** Adds the open descriptor `fd` to the item's files, taking ownership of it (the item closes it). It must be
 *  a read-only snapshot: a regular file opened O_RDONLY or a sealed memfd (see sdkhost_file_from_bytes() and
 *  sdkhost_file_open()); the host refuses anything else, and ends the worker for it. */
void sdkhost_item_add_file(sdkhost_item *item, int fd);

/** Makes `*copy` a deep copy of `item`, its descriptors duplicated (close-on-exec).
 *  @return 0, or an errno value (EMFILE, say) with `*copy` left empty. */
int sdkhost_item_copy(const sdkhost_item *item, sdkhost_item *copy);

/** Frees what the item holds and closes its descriptors; the item is left empty. NULL is a no-op. */
void sdkhost_item_free(sdkhost_item *item);

/** Frees `count` items and then the array `items` itself (as returned in a host call's result). */
void sdkhost_items_free(sdkhost_item *items, size_t count);

/* MARK: Files */

/** A new memfd named `name` (NULL: "sdkhost-attachment") holding a copy of `length` bytes, sealed against
 *  writing, growing and shrinking (and further seals), so no process can change it: what the host accepts.
 *  @return the descriptor (close-on-exec), or -1 with errno set. */
int sdkhost_file_from_bytes(const void *bytes, size_t length, const char *name);

/** Opens the regular file at `path` read-only (close-on-exec).
 *  @return the descriptor, or -1 with errno set (EINVAL when it is not a regular file). */
int sdkhost_file_open(const char *path);

/** Reads every byte of the file `fd` from offset 0 with positioned reads (the shared offset is not moved).
 *  On success `*bytes` is a malloc'd buffer the caller frees (NULL when `*length` is 0).
 *  @return 0, or an errno value. */
int sdkhost_file_read_all(int fd, uint8_t **bytes, size_t *length);

/* MARK: Codec (binary property lists, as on the wire) */

/** The largest frame payload either side accepts: 16 MiB. */
#define SDKHOST_MAX_FRAME_BYTES (16u << 20)

/** The most partial results of one request the host lets a worker have uncredited. */
#define SDKHOST_STREAM_WINDOW 16

/** The most descriptors one message may carry. */
#define SDKHOST_MAX_FILES_PER_MESSAGE 64

/** Encodes `value` as a bplist00 payload into a malloc'd buffer the caller frees.
 *  @return 0, or EINVAL (an SDKHOST_NONE value, or nesting deeper than 512), or EOVERFLOW. */
int sdkhost_plist_encode(const sdkhost_value *value, uint8_t **payload, size_t *length);

/** Encodes `value` as a whole frame (4-byte big-endian length, then the payload) into a malloc'd buffer.
 *  @return 0, EMSGSIZE for a payload over SDKHOST_MAX_FRAME_BYTES, or an error of sdkhost_plist_encode(). */
int sdkhost_frame_encode(const sdkhost_value *value, uint8_t **frame, size_t *length);

/** Decodes a bplist00 payload from untrusted bytes: every size and offset is checked, nesting, object counts
 *  and the decoded size are bounded as the host's decoder bounds them. Never reads out of bounds.
 *  @param why when not NULL, receives a one-line reason on failure (`why_size` bytes at most).
 *  @return 0 with `*value` set (the caller frees it), or EBADMSG. */
int sdkhost_plist_decode(const void *payload, size_t length, sdkhost_value *value, char *why, size_t why_size);

/* MARK: Requests */

/** One request as the extension sees it: its id, its input items, its cancellation state and the means to
 *  finish it. Opaque. The pointer a handler is given stays valid until the handler returns; to use it after
 *  that (from another thread, say), take a reference with sdkhost_request_retain() before returning. */
typedef struct sdkhost_request sdkhost_request;

/** An error a request is cancelled with, or a host call ended with: {domain, code, message}. */
typedef struct sdkhost_error {
    /** Who defined the code, e.g. "com.example.crasher-c" or "SDKHost" (malloc'd when owned by a result). */
    char *domain;
    /** A code within the domain. */
    int64_t code;
    /** A human-readable explanation. */
    char *message;
} sdkhost_error;

/** The request's id: a UUID string (36 characters), valid while the request is. */
const char *sdkhost_request_id(const sdkhost_request *request);

/** The input items the host sent, borrowed (valid while the request is); `*count` receives how many.
 *  A handler may read them, and may return them as they are (their descriptors go back too). */
const sdkhost_item *sdkhost_request_items(const sdkhost_request *request, size_t *count);

/** True once the host has cancelled the request: long work should check it and stop with
 *  sdkhost_cancel_request(request, "SDKHost", 1, "cancelled by the host"). */
bool sdkhost_request_is_cancelled(const sdkhost_request *request);

/** True once the request has been completed or cancelled from this side. */
bool sdkhost_request_is_finished(const sdkhost_request *request);

/** Completes the request with `count` items (borrowed: still the caller's afterwards; their descriptors are
 *  sent as they are). Only the first of complete/cancel counts; a later one is logged and ignored. A reply too
 *  large for a frame (over 16 MiB, or more than 64 files) cancels the request instead, with error
 *  {"SDKExtension", 3, "reply too large: ..."}; one holding a value no frame can hold (none, or nested deeper
 *  than 512) with {"SDKExtension", 3, "reply cannot be encoded: ..."}. Any thread.
 *  @return true if this call finished the request. */
bool sdkhost_complete_request(sdkhost_request *request, const sdkhost_item *items, size_t count);

/** Cancels the request, reporting the error {domain, code, message} (copied) to the host. Only the first of
 *  complete/cancel counts; a later one is logged and ignored. Any thread.
 *  @return true if this call finished the request. */
bool sdkhost_cancel_request(sdkhost_request *request, const char *domain, int64_t code, const char *message);

/** Sends `count` items (borrowed) as a partial result, before the request finishes. Blocks while the app has
 *  16 of this request's partial results it has not taken yet (the host's credit). Never call it from the
 *  runtime's reader thread (a cancel or host-call callback): it returns false there instead of blocking.
 *  @return false, dropping the items, when the request has finished or the host cancelled it. */
bool sdkhost_send_partial(sdkhost_request *request, const sdkhost_item *items, size_t count);

/** Takes a reference to the request, so that it stays valid after the handler returns. Any thread. */
void sdkhost_request_retain(sdkhost_request *request);

/** Gives back a reference taken with sdkhost_request_retain(). When the last one goes (the handler's own
 *  included) and the request is unfinished, nobody can finish it any more: the runtime logs it and answers the
 *  host's cancel for it (cancelled by the host, at once if the cancel came already); until then it stays open,
 *  as a Swift synchronous handler's would, and the host's deadline ends it. A reference held long after the
 *  request ended is reported to the host as a leak (LeakCheckDelaySeconds). */
void sdkhost_request_release(sdkhost_request *request);

/** Attaches a pointer of the extension's own to the request (for its cancel callback, say). */
void sdkhost_request_set_user_data(sdkhost_request *request, void *data);

/** The pointer set with sdkhost_request_set_user_data() (NULL until then). */
void *sdkhost_request_user_data(const sdkhost_request *request);

/* MARK: Host services */

/** How a host call ended. */
typedef enum sdkhost_call_status {
    SDKHOST_CALL_RESULT = 0,    /**< The app's service answered: `items` and `item_count`. */
    SDKHOST_CALL_ERROR = 1,     /**< It failed: `error` (from the host: not listed, not provided, the service
                                     failed; from the runtime: domain "SDKExtension", code 4 too many calls in
                                     flight, 5 the request has ended, 7 too large to send, 10 a blocking call
                                     on the reader thread). */
    SDKHOST_CALL_CANCELLED = 2  /**< Given up: sdkhost_cancel_host_call(), or the host cancelled the request. */
} sdkhost_call_status;

/** The outcome of a host call. Owned by whoever receives it; free it with sdkhost_call_result_free(). */
typedef struct sdkhost_call_result {
    /** How the call ended. */
    sdkhost_call_status status;
    /** SDKHOST_CALL_RESULT: the app's items (malloc'd array). */
    sdkhost_item *items;
    /** SDKHOST_CALL_RESULT: how many items. */
    size_t item_count;
    /** SDKHOST_CALL_ERROR: why. */
    sdkhost_error error;
} sdkhost_call_result;

/** Called once per call with its outcome, which it owns (free it with sdkhost_call_result_free()). It runs on
 *  the runtime's reader thread (an answer), or on the thread that ended the call (sdkhost_cancel_host_call(),
 *  the request's end) or started it (a call that fails at once). It must not block: no blocking host call, no
 *  sdkhost_send_partial() that has to wait. */
typedef void (*sdkhost_call_callback)(sdkhost_request *request, int64_t call, sdkhost_call_result *result,
                                      void *context);

/** Calls the app's host service `service` (one the manifest lists under HostServices) with `count` items
 *  (borrowed), and waits on this thread for its answer. A host cancel of the request ends the wait
 *  (SDKHOST_CALL_CANCELLED); the request's end ends it too (error code 5).
 *  @param result receives the outcome; the caller frees it with sdkhost_call_result_free().
 *  @return result->status. */
sdkhost_call_status sdkhost_call_host(sdkhost_request *request, const char *service, const sdkhost_item *items,
                                      size_t count, sdkhost_call_result *result);

/** Starts a call as sdkhost_call_host() does, without waiting: `callback` runs exactly once with the outcome.
 *  @return the call's number (positive; for sdkhost_cancel_host_call()), or 0 when it ended at once (its
 *  callback has run already, on this thread). */
int64_t sdkhost_call_host_async(sdkhost_request *request, const char *service, const sdkhost_item *items,
                                size_t count, sdkhost_call_callback callback, void *context);

/** Gives up on call `call` of the request: the host is told (its handler is cancelled), and the call's
 *  callback runs now with SDKHOST_CALL_CANCELLED.
 *  @return false when the call had already ended. */
bool sdkhost_cancel_host_call(sdkhost_request *request, int64_t call);

/** Frees what a call result holds (items, their descriptors, the error's strings). */
void sdkhost_call_result_free(sdkhost_call_result *result);

/* MARK: Running */

/** Called once per request, on a thread of its own that may block. The request must end with
 *  sdkhost_complete_request() or sdkhost_cancel_request(), now or later (retain it to finish it later). */
typedef void (*sdkhost_begin_handler)(sdkhost_request *request, void *context);

/** Called when the host cancels a request, on the runtime's reader thread: it must return quickly (set a flag,
 *  signal a condition). sdkhost_request_is_cancelled() is already true. */
typedef void (*sdkhost_cancel_handler)(sdkhost_request *request, void *context);

/** What an extension gives sdkhost_run(). */
typedef struct sdkhost_extension {
    /** Starts work on one request (required). */
    sdkhost_begin_handler begin;
    /** Learns of a host cancel (optional: NULL). */
    sdkhost_cancel_handler cancel;
    /** Passed to both callbacks. */
    void *context;
} sdkhost_extension;

/** Runs the worker on the calling thread (call it from main): connects to the host (descriptor
 *  SDKHOST_IPC_FD, default 3; when it is not open, says the program must be run through sdk-host and exits
 *  64), answers the handshake and heartbeats, and serves requests until the host goes away (exit 0). A protocol
 *  error from the host exits 2. Never returns. */
SDKHOST_NORETURN void sdkhost_run(const sdkhost_extension *extension);

/** Writes one line "sdk-extension[pid]: <message>" to stderr (which the host logs), in one write. */
void sdkhost_log(const char *format, ...) SDKHOST_PRINTF(1, 2);

/** The extension's identifier as the host passed it (SDKHOST_EXTENSION_ID), or "unknown". */
const char *sdkhost_extension_id(void);

/** The host connection's descriptor. For fault injection only (a crash-test extension writing bytes that are
 *  not frames): anything written here bypasses the runtime and its lock. */
int sdkhost_host_fd(void);

#ifdef __cplusplus
}
#endif
#endif /* SDKHOST_H */
