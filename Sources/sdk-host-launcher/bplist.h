// A bplist00 reader and writer just big enough for the launcher: it reads the profile the host sends (a
// dictionary of strings, integers, booleans and arrays of strings) and writes the one frame it sends back (a
// dictionary of strings and arrays of strings). Every offset and count is checked against the input's length.
#ifndef SDK_LAUNCHER_BPLIST_H
#define SDK_LAUNCHER_BPLIST_H

#include <stddef.h>
#include <stdint.h>

enum bp_kind { BP_NONE, BP_BOOL, BP_INT, BP_STRING, BP_ARRAY, BP_DICT };

struct bp_doc {
    const uint8_t *bytes;
    size_t length;
    size_t objects;
    size_t top;
    size_t table;
    unsigned offset_size;
    unsigned ref_size;
};

/// Checks the trailer; returns 0, or -1 with a reason in *why.
int bp_open(struct bp_doc *doc, const uint8_t *bytes, size_t length, const char **why);
/// The value under `key` in the top-level dictionary: its object index, or (size_t)-1 if absent.
size_t bp_lookup(const struct bp_doc *doc, const char *key);
enum bp_kind bp_kind_of(const struct bp_doc *doc, size_t object);
/// A string object as a new UTF-8 C string (UTF-16 is converted); NULL if not a string or malformed.
char *bp_string(const struct bp_doc *doc, size_t object);
/// An integer or boolean object; returns 0 and sets *out, or -1.
int bp_integer(const struct bp_doc *doc, size_t object, int64_t *out);
/// An array of strings as a new NULL-terminated vector; NULL if not an array of strings. *count gets its size.
char **bp_string_array(const struct bp_doc *doc, size_t object, size_t *count);

/// Builds a frame (4-byte big-endian length, then a bplist00 dictionary) of string and string-array values.
/// Non-ASCII bytes become '?'. Returns the frame's length, or 0 if it does not fit `capacity`.
struct bp_entry {
    const char *key;
    const char *string;          // a string value, or NULL
    const char *const *strings;  // else an array of `count` strings
    size_t count;
};
size_t bp_write_frame(const struct bp_entry *entries, size_t count, uint8_t *out, size_t capacity);

#endif
