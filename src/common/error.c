/*
 * Error texts and names (the DCP_ERRNO_MAP of dcp.h), and the version.
 */
#include "util.h"

const char *dcp_strerror(int code)
{
    switch (code) {
    case DCP_OK:
        return "success";
#define DCP_XX_TEXT(name, val, text)                                           \
    case DCP_##name:                                                           \
        return text;
        DCP_ERRNO_MAP(DCP_XX_TEXT)
#undef DCP_XX_TEXT
    default:
        return "unknown error";
    }
}

const char *dcp_err_name(int code)
{
    switch (code) {
    case DCP_OK:
        return "DCP_OK";
#define DCP_XX_NAME(name, val, text)                                           \
    case DCP_##name:                                                           \
        return "DCP_" #name;
        DCP_ERRNO_MAP(DCP_XX_NAME)
#undef DCP_XX_NAME
    default:
        return "DCP_UNKNOWN";
    }
}

unsigned dcp_version_number(void)
{
    return DCP_VERSION_NUMBER;
}

const char *dcp_version_string(void)
{
    return DCP_VERSION_STRING;
}
