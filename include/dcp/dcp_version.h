/*
 * dcp version macros. The library's run-time version is dcp_version_number()
 * in dcp.h; compare it with DCP_VERSION_NUMBER to detect a header/library
 * mismatch.
 */
#ifndef DCP_DCP_VERSION_H
#define DCP_DCP_VERSION_H

#define DCP_VERSION_MAJOR 0
#define DCP_VERSION_MINOR 1
#define DCP_VERSION_PATCH 0

#define DCP_VERSION_NUMBER                                                     \
    (DCP_VERSION_MAJOR * 10000 + DCP_VERSION_MINOR * 100 + DCP_VERSION_PATCH)

#define DCP_VERSION_STRING "0.1.0"

/* True when the headers are at least version major.minor.patch. */
#define DCP_AT_LEAST_VERSION(ma, mi, pa)                                       \
    (DCP_VERSION_NUMBER >= ((ma) * 10000 + (mi) * 100 + (pa)))

#endif /* DCP_DCP_VERSION_H */
