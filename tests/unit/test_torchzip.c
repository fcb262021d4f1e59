/*
 * torchzip: the writer against real torch 2.13 bytes, the reader on real and
 * on hostile items, the data.pkl interpreter.
 *
 * Ground truth: tests/data/torch_item_{w,f8,step}.bin (items that torch 2.13
 * dcp.save wrote), plus references embedded below as hex, made once with
 * torch 2.13 by this script (big.bin is torch.save of a uint8 tensor of
 * 0x100000010 zeros to a file, so its archive prefix is "big"):
 *
 *   def save(t): b = io.BytesIO(); torch.save(t, b); return b.getvalue()
 *   def pkl(t): return zipfile.ZipFile(io.BytesIO(save(t))).read(
 *       'archive/data.pkl')
 *   for dt, shape in cases: print(dt, shape, pkl(torch.zeros(shape, dtype=dt)))
 *   view: torch.arange(20.).reshape(4, 5)[1:3, 1:4]
 *   transposed: torch.zeros(2, 3, dtype=torch.float16).t()
 *   complex: torch.zeros(2, dtype=torch.complex64)
 *   uint16: torch.zeros(2, dtype=torch.uint16)
 *   qint8: torch.quantize_per_tensor(torch.zeros(3), 0.1, 0, torch.qint8)
 *   zero_size_item: save(torch.zeros(0))
 *   big_head = big.bin[:0x2c0]; big_tail = big.bin[0x100000000:]
 *
 * torch writes a last record, .data/serialization_id, that dcp does not;
 * since it is the last record, everything before it is byte-identical, and
 * strip_last_record() derives the expected archive by cutting it out of the
 * real one and fixing up the end records.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crc32.h"
#include "pickle.h"
#include "test.h"
#include "torchzip.h"

/* test.h's ASSERT_OK names codes with dcp_err_name(); the library's core.c
 * defines it, and this weak copy serves builds that do not link core.c. */
__attribute__((weak)) const char *dcp_err_name(int code)
{
    static char buf[32];
    (void)snprintf(buf, sizeof(buf), "code %d", code);
    return buf;
}

struct pkl_case {
    dcp_dtype dt;
    int ndim;
    int64_t sizes[DCP_MAX_NDIM];
    size_t len;
    const char *hex;
};

/* torch 2.13's data.pkl for torch.zeros(shape, dtype), made by the script in
 * the comment at the top of this file; the last is big.bin's */
static const struct pkl_case pkl_cases[] = {
    {DCP_F32,
     2,
     {2, 3},
     154,
     "800263746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76320a71"
     "002828580700000073746f72616765710163746f7263680a466c6f617453746f72616765"
     "0a71025801000000307103580300000063707571044b06747105514b004b024b03867106"
     "4b034b018671078963636f6c6c656374696f6e730a4f726465726564446963740a710829"
     "52710974710a52710b2e"},
    {DCP_F64,
     0,
     {0},
     143,
     "800263746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76320a71"
     "002828580700000073746f72616765710163746f7263680a446f75626c6553746f726167"
     "650a71025801000000307103580300000063707571044b01747105514b0029298963636f"
     "6c6c656374696f6e730a4f726465726564446963740a7106295271077471085271092e"},
    {DCP_F16,
     1,
     {5},
     149,
     "800263746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76320a71"
     "002828580700000073746f72616765710163746f7263680a48616c6653746f726167650a"
     "71025801000000307103580300000063707571044b05747105514b004b058571064b0185"
     "71078963636f6c6c656374696f6e730a4f726465726564446963740a7108295271097471"
     "0a52710b2e"},
    {DCP_BF16,
     1,
     {0},
     153,
     "800263746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76320a71"
     "002828580700000073746f72616765710163746f7263680a42466c6f6174313653746f72"
     "6167650a71025801000000307103580300000063707571044b00747105514b004b008571"
     "064b018571078963636f6c6c656374696f6e730a4f726465726564446963740a71082952"
     "710974710a52710b2e"},
    {DCP_I64,
     3,
     {2, 0, 3},
     157,
     "800263746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76320a71"
     "002828580700000073746f72616765710163746f7263680a4c6f6e6753746f726167650a"
     "71025801000000307103580300000063707571044b00747105514b004b024b004b038771"
     "064b034b034b018771078963636f6c6c656374696f6e730a4f726465726564446963740a"
     "71082952710974710a52710b2e"},
    {DCP_I32,
     1,
     {300},
     150,
     "800263746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76320a71"
     "002828580700000073746f72616765710163746f7263680a496e7453746f726167650a71"
     "025801000000307103580300000063707571044d2c01747105514b004d2c018571064b01"
     "8571078963636f6c6c656374696f6e730a4f726465726564446963740a71082952710974"
     "710a52710b2e"},
    {DCP_I16,
     1,
     {70000},
     156,
     "800263746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76320a71"
     "002828580700000073746f72616765710163746f7263680a53686f727453746f72616765"
     "0a71025801000000307103580300000063707571044a70110100747105514b004a701101"
     "008571064b018571078963636f6c6c656374696f6e730a4f726465726564446963740a71"
     "082952710974710a52710b2e"},
    {DCP_I8,
     4,
     {1, 1, 1, 1},
     163,
     "800263746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76320a71"
     "002828580700000073746f72616765710163746f7263680a4368617253746f726167650a"
     "71025801000000307103580300000063707571044b01747105514b00284b014b014b014b"
     "01747106284b014b014b014b017471078963636f6c6c656374696f6e730a4f7264657265"
     "64446963740a71082952710974710a52710b2e"},
    {DCP_U8,
     5,
     {2, 3, 4, 5, 6},
     169,
     "800263746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76320a71"
     "002828580700000073746f72616765710163746f7263680a4279746553746f726167650a"
     "71025801000000307103580300000063707571044dd002747105514b00284b024b034b04"
     "4b054b06747106284d68014b784b1e4b064b017471078963636f6c6c656374696f6e730a"
     "4f726465726564446963740a71082952710974710a52710b2e"},
    {DCP_BOOL,
     1,
     {3},
     149,
     "800263746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76320a71"
     "002828580700000073746f72616765710163746f7263680a426f6f6c53746f726167650a"
     "71025801000000307103580300000063707571044b03747105514b004b038571064b0185"
     "71078963636f6c6c656374696f6e730a4f726465726564446963740a7108295271097471"
     "0a52710b2e"},
    {DCP_F8_E4M3FN,
     1,
     {3},
     183,
     "800263746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76330a71"
     "002828580700000073746f72616765710163746f7263682e73746f726167650a556e7479"
     "70656453746f726167650a71025801000000307103580300000063707571044b03747105"
     "514b004b038571064b018571078963636f6c6c656374696f6e730a4f7264657265644469"
     "63740a71082952710963746f7263680a666c6f6174385f65346d33666e0a710a74710b52"
     "710c2e"},
    {DCP_F8_E5M2,
     2,
     {2, 2},
     185,
     "800263746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76330a71"
     "002828580700000073746f72616765710163746f7263682e73746f726167650a556e7479"
     "70656453746f726167650a71025801000000307103580300000063707571044b04747105"
     "514b004b024b028671064b024b018671078963636f6c6c656374696f6e730a4f72646572"
     "6564446963740a71082952710963746f7263680a666c6f6174385f65356d320a710a7471"
     "0b52710c2e"},
    {DCP_F64,
     8,
     {1, 2, 1, 2, 1, 2, 1, 2},
     181,
     "800263746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76320a71"
     "002828580700000073746f72616765710163746f7263680a446f75626c6553746f726167"
     "650a71025801000000307103580300000063707571044b10747105514b00284b014b024b"
     "014b024b014b024b014b02747106284b104b084b084b044b044b024b024b017471078963"
     "636f6c6c656374696f6e730a4f726465726564446963740a71082952710974710a52710b"
     "2e"},
    {DCP_F32,
     2,
     {256, 256},
     160,
     "800263746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76320a71"
     "002828580700000073746f72616765710163746f7263680a466c6f617453746f72616765"
     "0a71025801000000307103580300000063707571044a00000100747105514b004d00014d"
     "00018671064d00014b018671078963636f6c6c656374696f6e730a4f7264657265644469"
     "63740a71082952710974710a52710b2e"},
    {DCP_I32,
     1,
     {65536},
     154,
     "800263746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76320a71"
     "002828580700000073746f72616765710163746f7263680a496e7453746f726167650a71"
     "025801000000307103580300000063707571044a00000100747105514b004a0000010085"
     "71064b018571078963636f6c6c656374696f6e730a4f726465726564446963740a710829"
     "52710974710a52710b2e"},
    {DCP_F8_E4M3FN,
     2,
     {17, 300},
     190,
     "800263746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76330a71"
     "002828580700000073746f72616765710163746f7263682e73746f726167650a556e7479"
     "70656453746f726167650a71025801000000307103580300000063707571044dec137471"
     "05514b004b114d2c018671064d2c014b018671078963636f6c6c656374696f6e730a4f72"
     "6465726564446963740a71082952710963746f7263680a666c6f6174385f65346d33666e"
     "0a710a74710b52710c2e"},
    {DCP_BF16,
     1,
     {1},
     153,
     "800263746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76320a71"
     "002828580700000073746f72616765710163746f7263680a42466c6f6174313653746f72"
     "6167650a71025801000000307103580300000063707571044b01747105514b004b018571"
     "064b018571078963636f6c6c656374696f6e730a4f726465726564446963740a71082952"
     "710974710a52710b2e"},
    {DCP_I64,
     1,
     {0},
     149,
     "800263746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76320a71"
     "002828580700000073746f72616765710163746f7263680a4c6f6e6753746f726167650a"
     "71025801000000307103580300000063707571044b00747105514b004b008571064b0185"
     "71078963636f6c6c656374696f6e730a4f726465726564446963740a7108295271097471"
     "0a52710b2e"},
    {DCP_U8,
     1,
     {4294967312},
     159,
     "800263746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76320a71"
     "002828580700000073746f72616765710163746f7263680a4279746553746f726167650a"
     "71025801000000307103580300000063707571048a051000000001747105514b008a0510"
     "000000018571064b018571078963636f6c6c656374696f6e730a4f726465726564446963"
     "740a71082952710974710a52710b2e"},
};
static const char view_pkl_hex[] =
    "800263746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76320a71"
    "002828580700000073746f72616765710163746f7263680a466c6f617453746f72616765"
    "0a71025801000000307103580300000063707571044b14747105514b064b024b03867106"
    "4b054b018671078963636f6c6c656374696f6e730a4f726465726564446963740a710829"
    "52710974710a52710b2e";
static const char transposed_pkl_hex[] =
    "800263746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76320a71"
    "002828580700000073746f72616765710163746f7263680a48616c6653746f726167650a"
    "71025801000000307103580300000063707571044b06747105514b004b034b028671064b"
    "014b038671078963636f6c6c656374696f6e730a4f726465726564446963740a71082952"
    "710974710a52710b2e";
static const char complex_pkl_hex[] =
    "800263746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76320a71"
    "002828580700000073746f72616765710163746f7263680a436f6d706c6578466c6f6174"
    "53746f726167650a71025801000000307103580300000063707571044b02747105514b00"
    "4b028571064b018571078963636f6c6c656374696f6e730a4f726465726564446963740a"
    "71082952710974710a52710b2e";
static const char uint16_pkl_hex[] =
    "800263746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76330a71"
    "002828580700000073746f72616765710163746f7263682e73746f726167650a556e7479"
    "70656453746f726167650a71025801000000307103580300000063707571044b04747105"
    "514b004b028571064b018571078963636f6c6c656374696f6e730a4f7264657265644469"
    "63740a71082952710963746f7263680a75696e7431360a710a74710b52710c2e";
static const char qint8_pkl_hex[] =
    "800263746f7263682e5f7574696c730a5f72656275696c645f7174656e736f720a710028"
    "28580700000073746f72616765710163746f7263680a51496e743853746f726167650a71"
    "025801000000307103580300000063707571044b03747105514b004b038571064b018571"
    "0763746f7263680a7065725f74656e736f725f616666696e650a7108473fb99999999999"
    "9a4b008771098963636f6c6c656374696f6e730a4f726465726564446963740a710a2952"
    "710b74710c52710d2e";
static const char zero_size_item_hex[] =
    "504b03040000080800000000000000000000000000000000000010001200617263686976"
    "652f646174612e706b6c46420e005a5a5a5a5a5a5a5a5a5a5a5a5a5a800263746f726368"
    "2e5f7574696c730a5f72656275696c645f74656e736f725f76320a710028285807000000"
    "73746f72616765710163746f7263680a466c6f617453746f726167650a71025801000000"
    "307103580300000063707571044b00747105514b004b008571064b018571078963636f6c"
    "6c656374696f6e730a4f726465726564446963740a71082952710974710a52710b2e504b"
    "070816ea09f49600000096000000504b0304000008080000000000000000000000000000"
    "0000000017002500617263686976652f2e666f726d61745f76657273696f6e464221005a"
    "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a31504b07"
    "08b7efdc830100000001000000504b030400000808000000000000000000000000000000"
    "0000001a003700617263686976652f2e73746f726167655f616c69676e6d656e74464233"
    "005a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a"
    "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a3634504b07083f7771e90200000002000000504b"
    "03040000080800000000000000000000000000000000000011003f00617263686976652f"
    "627974656f7264657246423b005a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a"
    "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a"
    "6c6974746c65504b0708853de3190600000006000000504b030400000008000000000000"
    "0000000000000000000000000e003e00617263686976652f646174612f3046423a005a5a"
    "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a"
    "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a504b0304000008080000000000000000"
    "000000000000000000000f001300617263686976652f76657273696f6e46420f005a5a5a"
    "5a5a5a5a5a5a5a5a5a5a5a5a330a504b0708d19e67550200000002000000504b03040000"
    "08080000000000000000000000000000000000001e003200617263686976652f2e646174"
    "612f73657269616c697a6174696f6e5f696446422e005a5a5a5a5a5a5a5a5a5a5a5a5a5a"
    "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a31353732"
    "383139393531313835343634333032363030313135303530383736323434333136353436"
    "504b0708ba8e11a52800000028000000504b010200000000080800000000000016ea09f4"
    "9600000096000000100000000000000000000000000000000000617263686976652f6461"
    "74612e706b6c504b0102000000000808000000000000b7efdc8301000000010000001700"
    "000000000000000000000000e6000000617263686976652f2e666f726d61745f76657273"
    "696f6e504b01020000000008080000000000003f7771e902000000020000001a00000000"
    "00000000000000000051010000617263686976652f2e73746f726167655f616c69676e6d"
    "656e74504b0102000000000808000000000000853de31906000000060000001100000000"
    "000000000000000000d2010000617263686976652f627974656f72646572504b01020000"
    "000000080000000000000000000000000000000000000e00000000000000000000000000"
    "56020000617263686976652f646174612f30504b0102000000000808000000000000d19e"
    "675502000000020000000f00000000000000000000000000c0020000617263686976652f"
    "76657273696f6e504b0102000000000808000000000000ba8e11a528000000280000001e"
    "0000000000000000000000000012030000617263686976652f2e646174612f7365726961"
    "6c697a6174696f6e5f6964504b06062c000000000000001e032d00000000000000000007"
    "000000000000000700000000000000cf01000000000000b803000000000000504b060700"
    "000000870500000000000001000000504b05060000000007000700cf010000b803000000"
    "00";
static const char big_head_hex[] =
    "504b0304000008080000000000000000000000000000000000000c0016006269672f6461"
    "74612e706b6c464212005a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a800263746f726368"
    "2e5f7574696c730a5f72656275696c645f74656e736f725f76320a710028285807000000"
    "73746f72616765710163746f7263680a4279746553746f726167650a7102580100000030"
    "7103580300000063707571048a051000000001747105514b008a0510000000018571064b"
    "018571078963636f6c6c656374696f6e730a4f726465726564446963740a710829527109"
    "74710a52710b2e504b0708dff1d42d9f0000009f000000504b0304000008080000000000"
    "00000000000000000000000000130020006269672f2e666f726d61745f76657273696f6e"
    "46421c005a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a31504b07"
    "08b7efdc830100000001000000504b030400000808000000000000000000000000000000"
    "00000016003b006269672f2e73746f726167655f616c69676e6d656e74464237005a5a5a"
    "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a"
    "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a3634504b07083f7771e90200000002000000504b"
    "0304000008080000000000000000000000000000000000000d0043006269672f62797465"
    "6f7264657246423f005a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a"
    "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a"
    "6c6974746c65504b0708853de3190600000006000000504b030400000808000000000000"
    "0000000000000000000000000a0042006269672f646174612f3001001000100000000100"
    "0000000000000000000046422a005a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a"
    "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";
static const char big_tail_hex[] =
    "000000000000000000000000000000000000000000000000000000000000000000000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000"
    "000000000000000000000000000000000000000000000000000000000000000000000000"
    "504b0708bdf1efc910000000010000001000000001000000504b03040000080800000000"
    "00000000000000000000000000000b002f006269672f76657273696f6e01000800e80200"
    "000100000046421f005a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a"
    "5a5a5a5a330a504b0708d19e675502000000000000000200000000000000504b03040000"
    "08080000000000000000000000000000000000001a002e006269672f2e646174612f7365"
    "7269616c697a6174696f6e5f6964010008005a0300000100000046421e005a5a5a5a5a5a"
    "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a313537323831393935313138"
    "35343634333032363033373637383930363335333833373134343831504b07080cae527f"
    "28000000000000002800000000000000504b0102000000000808000000000000dff1d42d"
    "9f0000009f0000000c00000000000000000000000000000000006269672f646174612e70"
    "6b6c504b0102000000000808000000000000b7efdc830100000001000000130000000000"
    "0000000000000000ef0000006269672f2e666f726d61745f76657273696f6e504b010200"
    "00000008080000000000003f7771e9020000000200000016000000000000000000000000"
    "00510100006269672f2e73746f726167655f616c69676e6d656e74504b01020000000008"
    "08000000000000853de31906000000060000000d00000000000000000000000000d20100"
    "006269672f627974656f72646572504b0102000000000808000000000000bdf1efc9ffff"
    "ffffffffffff0a00140000000000000000000000560200006269672f646174612f300100"
    "100010000000010000001000000001000000504b0102000000000808000000000000d19e"
    "675502000000020000000b000c0000000000000000000000ffffffff6269672f76657273"
    "696f6e01000800e802000001000000504b01020000000008080000000000000cae527f28"
    "000000280000001a000c0000000000000000000000ffffffff6269672f2e646174612f73"
    "657269616c697a6174696f6e5f6964010008005a03000001000000504b06062c00000000"
    "0000001e032d00000000000000000007000000000000000700000000000000df01000000"
    "0000000004000001000000504b060700000000df0500000100000001000000504b050600"
    "00000007000700df010000ffffffff0000";

/* ------------------------------------------------------------------ */
/* Helpers                                                            */
/* ------------------------------------------------------------------ */

static uint8_t *unhex(const char *s, size_t *n)
{
    size_t len = strlen(s) / 2;
    uint8_t *p = malloc(len ? len : 1);
    for (size_t i = 0; i < len; i++) {
        unsigned v;
        (void)sscanf(s + 2 * i, "%2x", &v);
        p[i] = (uint8_t)v;
    }
    *n = len;
    return p;
}

static uint8_t *load_file(const char *name, size_t *n)
{
    const char *dir = getenv("DCP_TEST_DATA");
    char path[1024];
    FILE *f;
    uint8_t *p;
    long len;

    (void)snprintf(path, sizeof(path), "%s/%s", dir ? dir : "tests/data", name);
    f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s (set DCP_TEST_DATA)\n", path);
        return NULL;
    }
    (void)fseek(f, 0, SEEK_END);
    len = ftell(f);
    (void)fseek(f, 0, SEEK_SET);
    p = malloc((size_t)len + 1);
    if (fread(p, 1, (size_t)len, f) != (size_t)len) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *n = (size_t)len;
    return p;
}

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* An item in memory; flags reads outside it, can fail the k-th read. */
struct mem {
    const uint8_t *p;
    uint64_t len;
    int oob;
    int calls;
    int fail_at;
};

static int mem_read(void *opaque, uint64_t off, void *buf, size_t len,
                    struct dcp_err *err)
{
    struct mem *m = opaque;
    m->calls++;
    if (m->fail_at && m->calls == m->fail_at)
        return dcp__err(err, DCP_EIO, "injected read failure");
    if (off > m->len || len > m->len - off) {
        m->oob = 1;
        return dcp__err(err, DCP_EIO, "read outside the item");
    }
    memcpy(buf, m->p + off, len);
    return DCP_OK;
}

/* A sparse item: a few segments of bytes, zeros elsewhere. */
struct vimg {
    struct {
        uint64_t off;
        const uint8_t *p;
        size_t len;
    } seg[4];
    int nseg;
    uint64_t len;
    int oob;
};

static int vimg_read(void *opaque, uint64_t off, void *buf, size_t len,
                     struct dcp_err *err)
{
    struct vimg *v = opaque;
    uint8_t *b = buf;
    if (off > v->len || len > v->len - off) {
        v->oob = 1;
        return dcp__err(err, DCP_EIO, "read outside the item");
    }
    memset(b, 0, len);
    for (int i = 0; i < v->nseg; i++) {
        uint64_t s = v->seg[i].off, e = s + v->seg[i].len;
        uint64_t lo = off > s ? off : s, hi = off + len < e ? off + len : e;
        if (lo < hi)
            memcpy(b + (lo - off), v->seg[i].p + (lo - s), (size_t)(hi - lo));
    }
    return DCP_OK;
}

static int open_mem(struct tz_archive *a, const uint8_t *p, size_t len,
                    struct dcp_err *err)
{
    struct mem m = {p, len, 0, 0, 0};
    int rc = dcp__tz_open(a, len, mem_read, &m, err);
    return m.oob ? -1000 : rc;
}

/* Moves the writer's output to img, checking that it ends at w->pos. */
static int drain(struct tz_writer *w, struct dcp_buf *img)
{
    int rc = dcp__buf_put(img, w->out.p, w->out.len);
    w->out.len = 0;
    if (rc == DCP_OK && img->len != w->pos)
        return -1000;
    return rc;
}

/* A whole tensor item through dcp__tz_tensor_item_begin/end. */
static int write_tensor_item(struct dcp_buf *img, uint64_t item_off,
                             uint32_t align, dcp_dtype dt, int ndim,
                             const int64_t *sizes, const void *data,
                             size_t nbytes, uint64_t *data_off)
{
    struct tz_writer w;
    int rc = dcp__tz_writer_init(&w, item_off, align);
    if (rc == DCP_OK)
        rc = dcp__tz_tensor_item_begin(&w, dt, ndim, sizes, nbytes, data_off);
    if (rc == DCP_OK)
        rc = drain(&w, img);
    if (rc == DCP_OK)
        rc = dcp__buf_put(img, data, nbytes);
    if (rc == DCP_OK)
        rc = dcp__tz_tensor_item_end(&w, dcp__crc32(0, data, nbytes));
    if (rc == DCP_OK)
        rc = drain(&w, img);
    dcp__tz_writer_release(&w);
    return rc;
}

/*
 * The archive in buf (its bytes [base, base + len), which hold at least the
 * last record and everything after it) without its last record. Returns the
 * bytes [base, base + *out_len) of that archive.
 */
static uint8_t *strip_last_record(const uint8_t *buf, uint64_t base, size_t len,
                                  size_t *out_len, char *last_name, size_t cap)
{
    const uint8_t *eocd = buf + len - 22, *loc = eocd - 20, *z, *cd, *le;
    uint64_t n, cd_off, last_hdr;
    size_t pos = 0, last = 0, head, nl;
    uint8_t *out, *p;

    z = buf + (dcp__le64(loc + 8) - base);
    n = dcp__le64(z + 32);
    cd_off = dcp__le64(z + 48);
    cd = buf + (cd_off - base);
    for (uint64_t i = 0; i < n; i++) {
        last = pos;
        pos += 46u + dcp__le16(cd + pos + 28) + dcp__le16(cd + pos + 30) +
               dcp__le16(cd + pos + 32);
    }
    le = cd + last;
    nl = dcp__le16(le + 28);
    (void)snprintf(last_name, cap, "%.*s", (int)nl, (const char *)le + 46);
    last_hdr = dcp__le32(le + 42);
    if (last_hdr == 0xFFFFFFFFu) /* only the offset is in its zip64 extra */
        last_hdr = dcp__le64(le + 46 + nl + 4);
    head = (size_t)(last_hdr - base);
    *out_len = head + last + 56 + 20 + 22;
    out = malloc(*out_len);
    memcpy(out, buf, head);
    memcpy(out + head, cd, last);
    p = out + head + last;
    memcpy(p, z, 56);
    put64(p + 24, n - 1);
    put64(p + 32, n - 1);
    put64(p + 40, last);
    put64(p + 48, last_hdr);
    p += 56;
    memcpy(p, loc, 20);
    put64(p + 8, last_hdr + last);
    p += 20;
    memcpy(p, eocd, 22);
    put16(p + 8, (uint16_t)(n - 1));
    put16(p + 10, (uint16_t)(n - 1));
    put32(p + 12, (uint32_t)last);
    put32(p + 16, last_hdr >= 0xFFFFFFFFu ? 0xFFFFFFFFu : (uint32_t)last_hdr);
    return out;
}

/* Offset of central directory entry i of a small (non-zip64) item. */
static size_t cd_entry(const uint8_t *item, size_t len, int i)
{
    size_t pos = dcp__le32(item + len - 22 + 16);
    while (i-- > 0)
        pos += 46u + dcp__le16(item + pos + 28) + dcp__le16(item + pos + 30) +
               dcp__le16(item + pos + 32);
    return pos;
}

static int contains(const char *hay, const char *needle)
{
    return strstr(hay, needle) != NULL;
}

/* A tensor pickle with every part chosen by the test (no memo). */
struct pspec {
    const char *rebuild;
    const char *smod, *sname;
    const char *tag;
    const char *key;
    int64_t numel;
    int64_t offset;
    int nsize;
    int64_t size[12];
    int nstride;
    int64_t stride[12];
    const char *dtype; /* the 7th argument (v3), or NULL */
    int meta;          /* 1: empty metadata dict, 2: {"conj": True} */
    int drop;          /* arguments left off the end */
    int size_wrap;     /* torch.Size((...)) */
};

static struct pspec default_spec(void)
{
    struct pspec s = {"_rebuild_tensor_v2",
                      "torch",
                      "FloatStorage",
                      "storage",
                      "0",
                      6,
                      0,
                      2,
                      {2, 3},
                      2,
                      {3, 1},
                      NULL,
                      0,
                      0,
                      0};
    return s;
}

static int ints(struct pk_writer *w, int n, const int64_t *v)
{
    int rc = dcp__pkw_mark(w);
    for (int i = 0; rc == DCP_OK && i < n; i++)
        rc = dcp__pkw_int(w, v[i]);
    if (rc == DCP_OK)
        rc = dcp__pkw_op(w, PK_OP_TUPLE);
    return rc;
}

static int build_pickle(const struct pspec *s, struct dcp_buf *out)
{
    struct pk_writer w;
    int nargs = 6 + (s->dtype != NULL) + (s->meta != 0) - s->drop, rc;

    dcp__pk_writer_init(&w, out);
    rc = dcp__pkw_proto(&w);
    if (rc == DCP_OK)
        rc = dcp__pkw_global(&w, "torch._utils", s->rebuild);
    if (rc == DCP_OK)
        rc = dcp__pkw_mark(&w);
    if (rc == DCP_OK)
        rc = dcp__pkw_mark(&w);
    if (rc == DCP_OK)
        rc = dcp__pkw_str(&w, s->tag, strlen(s->tag));
    if (rc == DCP_OK)
        rc = dcp__pkw_global(&w, s->smod, s->sname);
    if (rc == DCP_OK)
        rc = dcp__pkw_str(&w, s->key, strlen(s->key));
    if (rc == DCP_OK)
        rc = dcp__pkw_str(&w, "cpu", 3);
    if (rc == DCP_OK)
        rc = dcp__pkw_int(&w, s->numel);
    if (rc == DCP_OK)
        rc = dcp__pkw_op(&w, PK_OP_TUPLE);
    if (rc == DCP_OK)
        rc = dcp__pkw_op(&w, PK_OP_BINPERSID);
    if (rc == DCP_OK && nargs >= 2)
        rc = dcp__pkw_int(&w, s->offset);
    if (rc == DCP_OK && nargs >= 3) {
        if (s->size_wrap)
            rc = dcp__pkw_global(&w, "torch", "Size");
        if (rc == DCP_OK)
            rc = ints(&w, s->nsize, s->size);
        if (rc == DCP_OK && s->size_wrap)
            rc = dcp__pkw_tuple(&w, 1);
        if (rc == DCP_OK && s->size_wrap)
            rc = dcp__pkw_op(&w, PK_OP_REDUCE);
    }
    if (rc == DCP_OK && nargs >= 4)
        rc = ints(&w, s->nstride, s->stride);
    if (rc == DCP_OK && nargs >= 5)
        rc = dcp__pkw_bool(&w, 0);
    if (rc == DCP_OK && nargs >= 6) {
        rc = dcp__pkw_global(&w, "collections", "OrderedDict");
        if (rc == DCP_OK)
            rc = dcp__pkw_empty_tuple(&w);
        if (rc == DCP_OK)
            rc = dcp__pkw_op(&w, PK_OP_REDUCE);
    }
    if (rc == DCP_OK && s->dtype && nargs >= 7)
        rc = dcp__pkw_global(&w, "torch", s->dtype);
    if (rc == DCP_OK && s->meta && !s->drop) {
        rc = dcp__pkw_empty_dict(&w);
        if (rc == DCP_OK && s->meta == 2) {
            rc = dcp__pkw_str(&w, "conj", 4);
            if (rc == DCP_OK)
                rc = dcp__pkw_bool(&w, 1);
            if (rc == DCP_OK)
                rc = dcp__pkw_op(&w, PK_OP_SETITEM);
        }
    }
    if (rc == DCP_OK)
        rc = dcp__pkw_op(&w, PK_OP_TUPLE);
    if (rc == DCP_OK)
        rc = dcp__pkw_op(&w, PK_OP_REDUCE);
    if (rc == DCP_OK)
        rc = dcp__pkw_stop(&w);
    dcp__pk_writer_release(&w);
    return rc;
}

static int parse_spec(const struct pspec *s, struct tz_tensor *t,
                      struct dcp_err *err)
{
    struct dcp_buf b = {0};
    int rc = build_pickle(s, &b);
    if (rc == DCP_OK)
        rc = dcp__tz_parse_tensor_pickle(b.p, b.len, t, err);
    dcp__buf_free(&b);
    return rc;
}

static const float arange6[6] = {0, 1, 2, 3, 4, 5};

/* ------------------------------------------------------------------ */
/* Writer: byte-exact against torch                                   */
/* ------------------------------------------------------------------ */

TEST(tensor_pickle_matches_torch)
{
    for (size_t i = 0; i < DCP_ARRAY_LEN(pkl_cases); i++) {
        const struct pkl_case *c = &pkl_cases[i];
        struct dcp_buf b = {0};
        size_t n;
        uint8_t *want = unhex(c->hex, &n);
        int rc;

        ASSERT_EQ(n, c->len);
        b.len = 0;
        ASSERT_OK(dcp__buf_put(&b, "xy", 2)); /* appends after content */
        rc = dcp__tz_tensor_pickle(&b, c->dt, c->ndim, c->sizes);
        if (rc != DCP_OK || b.len != n + 2 || memcmp(b.p + 2, want, n) != 0)
            fprintf(stderr, "case %zu (dtype %d, ndim %d) differs\n", i,
                    (int)c->dt, c->ndim);
        ASSERT_OK(rc);
        ASSERT_EQ(b.len, n + 2);
        ASSERT_MEM_EQ(b.p, "xy", 2);
        ASSERT_MEM_EQ(b.p + 2, want, n);
        free(want);
        dcp__buf_free(&b);
    }
}

TEST(tensor_pickle_rejects_bad_arguments)
{
    struct dcp_buf b = {0};
    int64_t s[DCP_MAX_NDIM + 1] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    int64_t neg[1] = {-1};
    int64_t huge[2] = {INT64_MAX / 2, 3};
    int64_t ovf_stride[3] = {1, INT64_MAX / 2, 3};
    int64_t zero_big[3] = {0, INT64_MAX / 2, 3};
    int64_t f8_ovf[1] = {INT64_MAX};

    ASSERT_RC(dcp__tz_tensor_pickle(&b, (dcp_dtype)0, 1, s), DCP_EINVAL);
    ASSERT_RC(dcp__tz_tensor_pickle(&b, (dcp_dtype)99, 1, s), DCP_EINVAL);
    ASSERT_RC(dcp__tz_tensor_pickle(&b, DCP_F32, DCP_MAX_NDIM + 1, s), DCP_EINVAL);
    ASSERT_RC(dcp__tz_tensor_pickle(&b, DCP_F32, -1, s), DCP_EINVAL);
    ASSERT_RC(dcp__tz_tensor_pickle(&b, DCP_F32, 1, neg), DCP_EINVAL);
    ASSERT_RC(dcp__tz_tensor_pickle(&b, DCP_F32, 2, huge), DCP_EINVAL);
    ASSERT_RC(dcp__tz_tensor_pickle(&b, DCP_F32, 3, ovf_stride), DCP_EINVAL);
    /* numel 0, but the contiguous strides overflow */
    ASSERT_RC(dcp__tz_tensor_pickle(&b, DCP_F32, 3, zero_big), DCP_EINVAL);
    /* float8: the storage counts bytes; INT64_MAX elements of 1 byte fit */
    ASSERT_OK(dcp__tz_tensor_pickle(&b, DCP_F8_E4M3FN, 1, f8_ovf));
    b.len = 0;
    ASSERT_RC(dcp__tz_tensor_pickle(NULL, DCP_F32, 0, NULL), DCP_EINVAL);
    ASSERT_OK(dcp__tz_tensor_pickle(&b, DCP_F32, DCP_MAX_NDIM, s));
    dcp__buf_free(&b);
}

/* Writes the real item's tensor with dcp and compares with torch's bytes. */
static void check_tensor_item(const char *file, dcp_dtype dt, int ndim,
                              const int64_t *sizes, size_t nbytes,
                              uint64_t want_data_off)
{
    size_t real_len, want_len;
    uint8_t *real = load_file(file, &real_len), *want;
    struct dcp_buf img = {0};
    uint64_t data_off = 0;
    char last[64];

    ASSERT(real != NULL);
    want = strip_last_record(real, 0, real_len, &want_len, last, sizeof last);
    ASSERT_STR_EQ(last, "archive/.data/serialization_id");
    ASSERT_OK(write_tensor_item(&img, 0, 64, dt, ndim, sizes,
                                real + want_data_off, nbytes, &data_off));
    ASSERT_U64_EQ(data_off, want_data_off);
    ASSERT_EQ(img.len, want_len);
    for (size_t i = 0; i < want_len; i++)
        if (img.p[i] != want[i])
            FAIL_AT_("%s: byte %zu is %02x, torch has %02x", file, i, img.p[i],
                     want[i]);
    free(want);
    free(real);
    dcp__buf_free(&img);
}

TEST(tensor_item_f32_matches_torch)
{
    int64_t sizes[2] = {2, 3};
    size_t len;
    uint8_t *real = load_file("torch_item_w.bin", &len);
    ASSERT(real != NULL);
    /* the data really is arange(6) at byte 0x2c0 */
    ASSERT_MEM_EQ(real + 0x2c0, arange6, sizeof arange6);
    free(real);
    check_tensor_item("torch_item_w.bin", DCP_F32, 2, sizes, 24, 0x2c0);
}

TEST(tensor_item_f8_matches_torch)
{
    int64_t sizes[1] = {3};
    check_tensor_item("torch_item_f8.bin", DCP_F8_E4M3FN, 1, sizes, 3, 0x2c0);
}

TEST(tensor_item_zero_size_matches_torch)
{
    /* an empty record: flags 0x0800 and no data descriptor */
    size_t real_len, want_len;
    uint8_t *real = unhex(zero_size_item_hex, &real_len), *want;
    struct dcp_buf img = {0};
    int64_t sizes[1] = {0};
    uint64_t off;
    char last[64];

    want = strip_last_record(real, 0, real_len, &want_len, last, sizeof last);
    ASSERT_STR_EQ(last, "archive/.data/serialization_id");
    ASSERT_OK(write_tensor_item(&img, 0, 64, DCP_F32, 1, sizes, "", 0, &off));
    ASSERT_U64_EQ(off, 704);
    ASSERT_EQ(img.len, want_len);
    ASSERT_MEM_EQ(img.p, want, want_len);
    ASSERT_EQ(dcp__le16(img.p + 598 + 6), 0x0800);
    free(want);
    free(real);
    dcp__buf_free(&img);
}

TEST(value_item_matches_torch)
{
    size_t real_len, want_len;
    uint8_t *real = load_file("torch_item_step.bin", &real_len), *want;
    struct tz_writer w;
    struct dcp_buf img = {0};
    char last[64];

    ASSERT(real != NULL);
    want = strip_last_record(real, 0, real_len, &want_len, last, sizeof last);
    ASSERT_STR_EQ(last, "archive/.data/serialization_id");
    ASSERT_OK(dcp__tz_writer_init(&w, 0, 64));
    ASSERT_OK(dcp__tz_value_item(&w, "\x80\x02K\x07.", 5));
    ASSERT_OK(drain(&w, &img));
    ASSERT_EQ(w.n, 5);
    dcp__tz_writer_release(&w);
    ASSERT_EQ(img.len, want_len);
    ASSERT_MEM_EQ(img.p, want, want_len);
    free(want);
    free(real);
    dcp__buf_free(&img);
}

/* The records of big.bin (prefix "big") up to data/0's header. */
static int big_leading(struct tz_writer *w, struct dcp_buf *pkl)
{
    int64_t size = 0x100000010;
    int rc = dcp__tz_tensor_pickle(pkl, DCP_U8, 1, &size);
    if (rc == DCP_OK)
        rc = dcp__tz_add(w, "big/data.pkl", pkl->p, pkl->len);
    if (rc == DCP_OK)
        rc = dcp__tz_add(w, "big/.format_version", "1", 1);
    if (rc == DCP_OK)
        rc = dcp__tz_add(w, "big/.storage_alignment", "64", 2);
    if (rc == DCP_OK)
        rc = dcp__tz_add(w, "big/byteorder", "little", 6);
    return rc;
}

TEST(zip64_item_matches_torch)
{
    /* torch.save of 0x100000010 bytes: a zip64 extra with both sizes for
     * data/0, 24-byte descriptors, zip64 extras with the header offset for
     * the records after it, 0xFFFFFFFF placeholders in the directory and in
     * the classic end record */
    size_t head_len, tail_len, want_len;
    uint8_t *head = unhex(big_head_hex, &head_len);
    uint8_t *tail = unhex(big_tail_hex, &tail_len), *want;
    struct tz_writer w;
    struct dcp_buf pkl = {0}, img = {0};
    uint64_t off = 0, tail_start = 0x2c0 + 0x100000010ull;
    char last[64];

    want = strip_last_record(tail, 0x100000000ull, tail_len, &want_len, last,
                             sizeof last);
    ASSERT_STR_EQ(last, "big/.data/serialization_id");
    ASSERT_OK(dcp__tz_writer_init(&w, 0, 64));
    ASSERT_OK(big_leading(&w, &pkl));
    ASSERT_OK(dcp__tz_stream_begin(&w, "big/data/0", 0x100000010ull, &off));
    ASSERT_U64_EQ(off, 0x2c0);
    ASSERT_EQ(w.out.len, head_len);
    ASSERT_MEM_EQ(w.out.p, head, head_len);
    w.out.len = 0; /* the 4 GiB of data are not written */
    ASSERT_OK(dcp__tz_stream_end(&w, 0xc9eff1bdu));
    ASSERT_U64_EQ(w.pos, tail_start + 24);
    ASSERT_OK(dcp__tz_add(&w, "big/version", "3\n", 2));
    ASSERT_OK(dcp__tz_finish(&w));
    ASSERT_OK(dcp__buf_put(&img, w.out.p, w.out.len));
    ASSERT_U64_EQ(w.pos, tail_start + img.len);
    ASSERT_EQ(want_len, (size_t)(tail_start - 0x100000000ull) + img.len);
    ASSERT_MEM_EQ(img.p, want + (tail_start - 0x100000000ull), img.len);

    /* the reader on the real archive (with serialization_id) and on ours */
    for (int pass = 0; pass < 2; pass++) {
        struct vimg v = {{{0, head, head_len}, {0, NULL, 0}}, 2, 0, 0};
        struct tz_archive a;
        struct dcp_err err = {0};
        const struct tz_entry *e;
        uint8_t *buf;

        if (pass == 0) {
            v.seg[1].off = 0x100000000ull;
            v.seg[1].p = tail;
            v.seg[1].len = tail_len;
            v.len = 0x100000000ull + tail_len;
        } else {
            v.seg[1].off = tail_start;
            v.seg[1].p = img.p;
            v.seg[1].len = img.len;
            v.len = tail_start + img.len;
        }
        ASSERT_OK(dcp__tz_open(&a, v.len, vimg_read, &v, &err));
        ASSERT_EQ(v.oob, 0);
        ASSERT_EQ(a.n, pass == 0 ? 7 : 6);
        ASSERT_STR_EQ(a.prefix, "big");
        e = dcp__tz_find(&a, "data/0");
        ASSERT(e != NULL);
        ASSERT_U64_EQ(e->header_off, 598);
        ASSERT_U64_EQ(e->data_off, 0x2c0);
        ASSERT_U64_EQ(e->size, 0x100000010ull);
        ASSERT_EQ(e->crc, 0xc9eff1bdu);
        e = dcp__tz_find(&a, "version");
        ASSERT(e != NULL);
        ASSERT_U64_EQ(e->header_off, 4294968040ull);
        ASSERT_OK(dcp__tz_read_entry(&a, e, 16, 1, vimg_read, &v, &buf, &err));
        ASSERT_MEM_EQ(buf, "3\n", 2);
        dcp__free(buf);
        e = dcp__tz_find(&a, "data.pkl");
        ASSERT(e != NULL);
        ASSERT_OK(dcp__tz_read_entry(&a, e, 4096, 1, vimg_read, &v, &buf, &err));
        ASSERT_EQ(e->size, pkl.len);
        ASSERT_MEM_EQ(buf, pkl.p, pkl.len);
        dcp__free(buf);
        ASSERT_RC(dcp__tz_read_entry(&a, dcp__tz_find(&a, "data/0"), 1 << 20, 1,
                                vimg_read, &v, &buf, &err),
                  DCP_ELIMIT);
        ASSERT(buf == NULL);
    }
    dcp__tz_writer_release(&w);
    dcp__buf_free(&pkl);
    dcp__buf_free(&img);
    free(want);
    free(head);
    free(tail);
}

TEST(zip64_header_matches_torch)
{
    /* torch.save({'a': zeros(0x100000010, uint8), 'b': zeros(0x100000020,
     * uint8)}) to big2.bin: the local header of big2/data/1, at byte
     * 0x100000328, is past 4 GiB and over 4 GiB long */
    static const char want_hex[] =
        "504b0304000008080000000000000000000000000000000000000b002f0062696732"
        "2f646174612f310100180020000000010000000000000000000000280300000100"
        "000046420f005a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";
    struct tz_writer w;
    uint64_t off;
    size_t n;
    uint8_t *want = unhex(want_hex, &n);

    ASSERT_OK(dcp__tz_writer_init(&w, 0, 64));
    w.pos = 0x100000328ull; /* as if the records before it were written */
    ASSERT_OK(dcp__tz_stream_begin(&w, "big2/data/1", 0x100000020ull, &off));
    ASSERT_U64_EQ(off, 0x100000328ull + n);
    ASSERT_U64_EQ(off % 64, 0);
    ASSERT_EQ(w.out.len, n);
    ASSERT_MEM_EQ(w.out.p, want, n);
    dcp__tz_writer_release(&w);
    free(want);
}

TEST(zip64_both_size_and_offset)
{
    /* a second 5 GiB record at an offset past 4 GiB: its local extra holds
     * [size, 0, offset] (28 bytes), its directory entry [size, size,
     * offset] */
    const uint64_t big = 5ull << 30;
    struct tz_writer w;
    struct dcp_buf h1 = {0}, h2 = {0}, tail = {0};
    uint64_t off1, off2, hdr2;
    uint8_t want[128];
    size_t n;

    ASSERT_OK(dcp__tz_writer_init(&w, 0, 64));
    ASSERT_OK(dcp__tz_stream_begin(&w, "archive/a", big, &off1));
    ASSERT_OK(dcp__buf_put(&h1, w.out.p, w.out.len));
    w.out.len = 0;
    /* local header: 30 + 9 + zip64 (4 + 16) + FB (4 + pad) */
    ASSERT_U64_EQ(off1, 64);
    ASSERT_EQ(h1.len, 64);
    ASSERT_EQ(dcp__le32(h1.p), 0x04034b50u);
    ASSERT_EQ(dcp__le16(h1.p + 6), 0x0808);
    ASSERT_EQ(dcp__le32(h1.p + 14), 0);
    ASSERT_EQ(dcp__le32(h1.p + 18), 0);
    ASSERT_EQ(dcp__le32(h1.p + 22), 0);
    ASSERT_EQ(dcp__le16(h1.p + 28), 64 - 39);
    ASSERT_MEM_EQ(h1.p + 30, "archive/a", 9);
    ASSERT_EQ(dcp__le16(h1.p + 39), 1);
    ASSERT_EQ(dcp__le16(h1.p + 41), 16);
    ASSERT_U64_EQ(dcp__le64(h1.p + 43), big);
    ASSERT_U64_EQ(dcp__le64(h1.p + 51), 0); /* as miniz: not known yet */
    ASSERT_MEM_EQ(h1.p + 59, "FB", 2);
    ASSERT_EQ(dcp__le16(h1.p + 61), 1);
    ASSERT_EQ(h1.p[63], 'Z');
    ASSERT_OK(dcp__tz_stream_end(&w, 0x11223344u));
    n = w.out.len;
    ASSERT_EQ(n, 24);
    put32(want, 0x08074b50u);
    put32(want + 4, 0x11223344u);
    put64(want + 8, big);
    put64(want + 16, big);
    ASSERT_MEM_EQ(w.out.p, want, 24);
    ASSERT_OK(dcp__buf_put(&h2, w.out.p, w.out.len));
    w.out.len = 0;
    hdr2 = w.pos;
    ASSERT_U64_EQ(hdr2, 64 + big + 24);
    ASSERT_OK(dcp__tz_stream_begin(&w, "archive/b", big, &off2));
    /* 30 + 9 + zip64 (4 + 24) + FB 4 = 71 bytes, padded to the next 64 */
    ASSERT_U64_EQ(off2 % 64, 0);
    ASSERT_U64_EQ(off2, hdr2 + 71 + ((64 - (hdr2 + 71) % 64) % 64));
    ASSERT_EQ(dcp__le16(w.out.p + 28), off2 - hdr2 - 39);
    ASSERT_EQ(dcp__le16(w.out.p + 39), 1);
    ASSERT_EQ(dcp__le16(w.out.p + 41), 24);
    ASSERT_U64_EQ(dcp__le64(w.out.p + 43), big);
    ASSERT_U64_EQ(dcp__le64(w.out.p + 51), 0);
    ASSERT_U64_EQ(dcp__le64(w.out.p + 59), hdr2);
    ASSERT_MEM_EQ(w.out.p + 67, "FB", 2);
    ASSERT_OK(dcp__buf_put(&h2, w.out.p, w.out.len));
    w.out.len = 0;
    ASSERT_OK(dcp__tz_stream_end(&w, 0x55667788u));
    ASSERT_OK(dcp__tz_add(&w, "archive/c", "x", 1));
    ASSERT_OK(dcp__tz_finish(&w));
    ASSERT_OK(dcp__buf_put(&tail, w.out.p, w.out.len));
    {
        /* directory entry of b: placeholders and [size, size, offset] */
        const uint64_t tail_off = off2 + big;
        uint64_t cd_off = dcp__le64(tail.p + tail.len - 22 - 20 - 56 + 48);
        const uint8_t *cd = tail.p + (cd_off - tail_off), *eb;
        size_t e1 = 46 + 9 + 20;
        eb = cd + e1;
        ASSERT_EQ(dcp__le32(cd + 20), 0xFFFFFFFFu);
        ASSERT_EQ(dcp__le32(cd + 24), 0xFFFFFFFFu);
        ASSERT_EQ(dcp__le32(cd + 42), 0);
        ASSERT_EQ(dcp__le16(cd + 30), 20);
        ASSERT_EQ(dcp__le32(eb + 16), 0x55667788u);
        ASSERT_EQ(dcp__le32(eb + 20), 0xFFFFFFFFu);
        ASSERT_EQ(dcp__le32(eb + 24), 0xFFFFFFFFu);
        ASSERT_EQ(dcp__le32(eb + 42), 0xFFFFFFFFu);
        ASSERT_EQ(dcp__le16(eb + 30), 28);
        ASSERT_U64_EQ(dcp__le64(eb + 46 + 9 + 4), big);
        ASSERT_U64_EQ(dcp__le64(eb + 46 + 9 + 12), big);
        ASSERT_U64_EQ(dcp__le64(eb + 46 + 9 + 20), hdr2);
        /* classic end record: offset placeholder */
        ASSERT_EQ(dcp__le32(tail.p + tail.len - 22 + 16), 0xFFFFFFFFu);
        ASSERT_EQ(dcp__le16(tail.p + tail.len - 22 + 10), 3);

        struct vimg v = {{{0, h1.p, h1.len},
                          {64 + big, h2.p, h2.len},
                          {tail_off, tail.p, tail.len}},
                         3,
                         tail_off + tail.len,
                         0};
        struct tz_archive a;
        struct dcp_err err = {0};
        ASSERT_OK(dcp__tz_open(&a, v.len, vimg_read, &v, &err));
        ASSERT_EQ(v.oob, 0);
        ASSERT_EQ(a.n, 3);
        ASSERT_U64_EQ(a.ent[1].header_off, hdr2);
        ASSERT_U64_EQ(a.ent[1].data_off, off2);
        ASSERT_U64_EQ(a.ent[1].size, big);
        ASSERT_EQ(a.ent[1].crc, 0x55667788u);
        ASSERT_U64_EQ(a.ent[2].header_off, off2 + big + 24);
    }
    dcp__tz_writer_release(&w);
    dcp__buf_free(&h1);
    dcp__buf_free(&h2);
    dcp__buf_free(&tail);
}

TEST(alignment_is_absolute)
{
    /* item at file offset 5044: with align 4096 every record's data starts
     * on a 4096-byte file offset; with align 64 on a 64-byte one */
    static const uint32_t aligns[] = {64, 4096, 1, 2, 32768};
    int64_t sizes[2] = {2, 3};

    for (size_t k = 0; k < DCP_ARRAY_LEN(aligns); k++) {
        struct dcp_buf img = {0};
        struct tz_archive a;
        struct dcp_err err = {0};
        uint64_t off;
        uint8_t *buf;

        ASSERT_OK(write_tensor_item(&img, 5044, aligns[k], DCP_F32, 2, sizes,
                                    arange6, 24, &off));
        ASSERT_U64_EQ((5044 + off) % aligns[k], 0);
        ASSERT_OK(open_mem(&a, img.p, img.len, &err));
        ASSERT_EQ(a.n, 6);
        for (size_t i = 0; i < a.n; i++)
            ASSERT_U64_EQ((5044 + a.ent[i].data_off) % aligns[k], 0);
        ASSERT_U64_EQ(dcp__tz_find(&a, "data/0")->data_off, off);
        {
            struct mem m = {img.p, img.len, 0, 0, 0};
            ASSERT_OK(dcp__tz_read_entry(&a, dcp__tz_find(&a, "data/0"), 24, 1, mem_read,
                                    &m, &buf, &err));
            ASSERT_MEM_EQ(buf, arange6, 24);
            dcp__free(buf);
        }
        dcp__buf_free(&img);
    }
    {
        struct tz_writer w;
        ASSERT_RC(dcp__tz_writer_init(&w, 0, 0), DCP_EINVAL);
        ASSERT_RC(dcp__tz_writer_init(&w, 0, 3), DCP_EINVAL);
        ASSERT_RC(dcp__tz_writer_init(&w, 0, 65536), DCP_EINVAL);
        ASSERT_RC(dcp__tz_writer_init(NULL, 0, 64), DCP_EINVAL);
    }
}

TEST(random_items_round_trip)
{
    static const dcp_dtype dts[] = {
        DCP_F64, DCP_F32, DCP_F16, DCP_BF16, DCP_F8_E4M3FN, DCP_F8_E5M2,
        DCP_I64, DCP_I32, DCP_I16, DCP_I8,   DCP_U8,        DCP_BOOL};
    static const size_t esz[] = {8, 4, 2, 2, 1, 1, 8, 4, 2, 1, 1, 1};
    uint64_t seed = 12345;

    for (int trial = 0; trial < 300; trial++) {
        struct dcp_buf img = {0};
        struct tz_archive a;
        struct dcp_err err = {0};
        struct tz_tensor t;
        int64_t sizes[DCP_MAX_NDIM];
        uint64_t item_off, off;
        uint32_t align;
        size_t k, numel = 1;
        int ndim;
        uint8_t *data, *buf;

        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        k = (size_t)(seed >> 33) % DCP_ARRAY_LEN(dts);
        ndim = (int)((seed >> 40) % (DCP_MAX_NDIM + 1));
        align = 1u << ((seed >> 20) % 16);
        item_off = (seed >> 7) & 0xFFFFFFFFFFull;
        for (int i = 0; i < ndim; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            sizes[i] = (int64_t)((seed >> 40) % 4);
            numel *= (size_t)sizes[i];
        }
        data = malloc(numel * esz[k] + 1);
        for (size_t i = 0; i < numel * esz[k]; i++)
            data[i] = (uint8_t)(i * 7 + (size_t)trial);
        ASSERT_OK(write_tensor_item(&img, item_off, align, dts[k], ndim, sizes,
                                    data, numel * esz[k], &off));
        ASSERT_U64_EQ((item_off + off) % align, 0);
        ASSERT_OK(open_mem(&a, img.p, img.len, &err));
        for (size_t i = 0; i < a.n; i++)
            ASSERT_U64_EQ((item_off + a.ent[i].data_off) % align, 0);
        {
            struct mem m = {img.p, img.len, 0, 0, 0};
            ASSERT_OK(dcp__tz_read_entry(&a, dcp__tz_find(&a, "data.pkl"), 4096, 1,
                                    mem_read, &m, &buf, &err));
            ASSERT_OK(dcp__tz_parse_tensor_pickle(buf, dcp__tz_find(&a, "data.pkl")->size,
                                             &t, &err));
            dcp__free(buf);
            ASSERT_EQ(t.dtype, dts[k]);
            ASSERT_EQ(t.ndim, ndim);
            for (int i = 0; i < ndim; i++)
                ASSERT_EQ(t.size[i], sizes[i]);
            ASSERT_U64_EQ(t.storage_numel, numel);
            ASSERT_STR_EQ(t.key, "0");
            ASSERT_OK(dcp__tz_read_entry(&a, dcp__tz_find(&a, "data/0"), numel * esz[k],
                                    1, mem_read, &m, &buf, &err));
            ASSERT_MEM_EQ(buf, data, numel * esz[k]);
            dcp__free(buf);
        }
        free(data);
        dcp__buf_free(&img);
    }
}

TEST(writer_misuse)
{
    struct tz_writer w;
    char name[TZ_MAX_NAME + 2];
    uint64_t off;
    int64_t sizes[2] = {2, 3};

    memset(name, 'a', sizeof(name) - 1);
    name[sizeof(name) - 1] = '\0';
    ASSERT_OK(dcp__tz_writer_init(&w, 0, 64));
    ASSERT_RC(dcp__tz_add(&w, name, "x", 1), DCP_EINVAL);
    name[TZ_MAX_NAME] = '\0';
    ASSERT_OK(dcp__tz_add(&w, name, "x", 1));
    ASSERT_RC(dcp__tz_add(&w, "", "x", 1), DCP_EINVAL);
    ASSERT_RC(dcp__tz_add(&w, NULL, "x", 1), DCP_EINVAL);
    ASSERT_RC(dcp__tz_add(&w, "archive/x", NULL, 1), DCP_EINVAL);
    ASSERT_RC(dcp__tz_stream_end(&w, 0), DCP_EINVAL);
    ASSERT_OK(dcp__tz_stream_begin(&w, "archive/s", 10, &off));
    ASSERT_RC(dcp__tz_add(&w, "archive/x", "x", 1), DCP_EINVAL);
    ASSERT_RC(dcp__tz_stream_begin(&w, "archive/t", 1, &off), DCP_EINVAL);
    ASSERT_RC(dcp__tz_finish(&w), DCP_EINVAL);
    ASSERT_OK(dcp__tz_stream_end(&w, 0));
    while (w.n < TZ_MAX_ENTRIES)
        ASSERT_OK(dcp__tz_add(&w, "archive/x", "x", 1));
    ASSERT_RC(dcp__tz_add(&w, "archive/x", "x", 1), DCP_ELIMIT);
    ASSERT_OK(dcp__tz_finish(&w));
    dcp__tz_writer_release(&w);
    dcp__tz_writer_release(NULL);

    ASSERT_OK(dcp__tz_writer_init(&w, 0, 64));
    ASSERT_RC(dcp__tz_tensor_item_begin(&w, DCP_F32, 2, sizes, 23, &off),
              DCP_EINVAL);
    ASSERT_RC(dcp__tz_tensor_item_begin(&w, (dcp_dtype)0, 2, sizes, 24, &off),
              DCP_EINVAL);
    ASSERT_RC(dcp__tz_tensor_item_begin(&w, DCP_F32, 9, sizes, 24, &off),
              DCP_EINVAL);
    ASSERT_EQ(w.n, 0);
    ASSERT_EQ(w.out.len, 0);
    ASSERT_RC(dcp__tz_tensor_item_end(&w, 0), DCP_EINVAL);
    ASSERT_RC(dcp__tz_value_item(&w, NULL, 3), DCP_EINVAL);
    dcp__tz_writer_release(&w);
}

/* ------------------------------------------------------------------ */
/* Reader on real items                                               */
/* ------------------------------------------------------------------ */

TEST(open_real_items)
{
    static const char *const names[] = {
        "data.pkl", ".format_version", ".storage_alignment",    "byteorder",
        "data/0",   "version",         ".data/serialization_id"};
    static const char *const files[] = {"torch_item_w.bin", "torch_item_f8.bin",
                                        "torch_item_step.bin"};

    for (size_t f = 0; f < DCP_ARRAY_LEN(files); f++) {
        size_t len;
        uint8_t *item = load_file(files[f], &len), *buf;
        struct tz_archive a;
        struct dcp_err err = {0};
        struct mem m;
        size_t want_n = f == 2 ? 6 : 7;

        ASSERT(item != NULL);
        m = (struct mem){item, len, 0, 0, 0};
        ASSERT_OK(dcp__tz_open(&a, len, mem_read, &m, &err));
        ASSERT_EQ(m.oob, 0);
        ASSERT_EQ(a.n, want_n);
        ASSERT_STR_EQ(a.prefix, "archive");
        ASSERT_U64_EQ(a.item_len, len);
        for (size_t i = 0, j = 0; i < a.n; i++, j++) {
            if (f == 2 && j == 4)
                j++; /* a value item has no data/0 */
            ASSERT_STR_EQ(a.ent[i].name, names[j]);
            ASSERT_U64_EQ(a.ent[i].data_off % 64, 0);
            ASSERT_OK(dcp__tz_read_entry(&a, &a.ent[i], 1024, 1, mem_read, &m, &buf,
                                    &err));
            ASSERT_EQ(dcp__crc32(0, buf, (size_t)a.ent[i].size), a.ent[i].crc);
            dcp__free(buf);
        }
        ASSERT_U64_EQ(a.ent[0].header_off, 0);
        ASSERT_U64_EQ(a.ent[0].data_off, 64);
        ASSERT(dcp__tz_find(&a, "archive/data.pkl") == NULL);
        ASSERT(dcp__tz_find(&a, "nope") == NULL);
        ASSERT(dcp__tz_find(&a, "version") == &a.ent[want_n - 2]);
        ASSERT(dcp__tz_find(NULL, "version") == NULL);
        if (f == 2) {
            ASSERT_OK(dcp__tz_read_entry(&a, dcp__tz_find(&a, "data.pkl"), 5, 1, mem_read,
                                    &m, &buf, &err));
            ASSERT_MEM_EQ(buf, "\x80\x02K\x07.", 5);
            dcp__free(buf);
            ASSERT_RC(dcp__tz_read_entry(&a, dcp__tz_find(&a, "data.pkl"), 4, 1, mem_read,
                                    &m, &buf, &err),
                      DCP_ELIMIT);
        }
        free(item);
    }
}

static void parse_real(const char *file, struct tz_tensor *t)
{
    size_t len;
    uint8_t *item = load_file(file, &len), *buf;
    struct tz_archive a;
    struct dcp_err err = {0};
    struct mem m = {item, len, 0, 0, 0};

    ASSERT(item != NULL);
    ASSERT_OK(dcp__tz_open(&a, len, mem_read, &m, &err));
    ASSERT_OK(dcp__tz_read_entry(&a, dcp__tz_find(&a, "data.pkl"), 4096, 1, mem_read, &m,
                            &buf, &err));
    ASSERT_OK(
        dcp__tz_parse_tensor_pickle(buf, dcp__tz_find(&a, "data.pkl")->size, t, &err));
    dcp__free(buf);
    free(item);
}

TEST(parse_real_f32)
{
    struct tz_tensor t;
    parse_real("torch_item_w.bin", &t);
    if (test_failed_)
        return;
    ASSERT_EQ(t.dtype, DCP_F32);
    ASSERT_EQ(t.ndim, 2);
    ASSERT_EQ(t.size[0], 2);
    ASSERT_EQ(t.size[1], 3);
    ASSERT_EQ(t.stride[0], 3);
    ASSERT_EQ(t.stride[1], 1);
    ASSERT_EQ(t.storage_offset, 0);
    ASSERT_U64_EQ(t.storage_numel, 6);
    ASSERT_STR_EQ(t.key, "0");
}

TEST(parse_real_f8)
{
    struct tz_tensor t;
    parse_real("torch_item_f8.bin", &t);
    if (test_failed_)
        return;
    ASSERT_EQ(t.dtype, DCP_F8_E4M3FN);
    ASSERT_EQ(t.ndim, 1);
    ASSERT_EQ(t.size[0], 3);
    ASSERT_EQ(t.stride[0], 1);
    ASSERT_U64_EQ(t.storage_numel, 3);
    ASSERT_STR_EQ(t.key, "0");
}

TEST(parse_torch_pickles)
{
    struct dcp_err err = {0};
    struct tz_tensor t;
    size_t n;
    uint8_t *p;

    for (size_t i = 0; i < DCP_ARRAY_LEN(pkl_cases); i++) {
        const struct pkl_case *c = &pkl_cases[i];
        int64_t stride = 1, numel = 1;
        p = unhex(c->hex, &n);
        ASSERT_OK(dcp__tz_parse_tensor_pickle(p, n, &t, &err));
        free(p);
        ASSERT_EQ(t.dtype, c->dt);
        ASSERT_EQ(t.ndim, c->ndim);
        ASSERT_EQ(t.storage_offset, 0);
        for (int d = c->ndim - 1; d >= 0; d--) {
            ASSERT_EQ(t.size[d], c->sizes[d]);
            ASSERT_EQ(t.stride[d], stride);
            stride *= c->sizes[d] > 1 ? c->sizes[d] : 1;
            numel *= c->sizes[d];
        }
        ASSERT_U64_EQ(t.storage_numel, (uint64_t)numel);
        ASSERT_STR_EQ(t.key, "0");
    }

    p = unhex(view_pkl_hex, &n); /* arange(20.).reshape(4,5)[1:3,1:4] */
    ASSERT_OK(dcp__tz_parse_tensor_pickle(p, n, &t, &err));
    free(p);
    ASSERT_EQ(t.dtype, DCP_F32);
    ASSERT_EQ(t.storage_offset, 6);
    ASSERT_EQ(t.size[0], 2);
    ASSERT_EQ(t.size[1], 3);
    ASSERT_EQ(t.stride[0], 5);
    ASSERT_EQ(t.stride[1], 1);
    ASSERT_U64_EQ(t.storage_numel, 20);

    p = unhex(transposed_pkl_hex, &n);
    ASSERT_OK(dcp__tz_parse_tensor_pickle(p, n, &t, &err));
    free(p);
    ASSERT_EQ(t.dtype, DCP_F16);
    ASSERT_EQ(t.size[0], 3);
    ASSERT_EQ(t.size[1], 2);
    ASSERT_EQ(t.stride[0], 1);
    ASSERT_EQ(t.stride[1], 3);

    /* torch.ComplexFloatStorage (v2) and torch.uint16 (v3, UntypedStorage
     * of 4 bytes): 2 elements each */
    p = unhex(complex_pkl_hex, &n);
    ASSERT_OK(dcp__tz_parse_tensor_pickle(p, n, &t, &err));
    ASSERT_EQ(t.dtype, DCP_C64);
    ASSERT_U64_EQ(t.storage_numel, 2);
    ASSERT_EQ(t.size[0], 2);
    free(p);
    p = unhex(uint16_pkl_hex, &n);
    ASSERT_OK(dcp__tz_parse_tensor_pickle(p, n, &t, &err));
    ASSERT_EQ(t.dtype, DCP_U16);
    ASSERT_U64_EQ(t.storage_numel, 2);
    free(p);
    p = unhex(qint8_pkl_hex, &n);
    ASSERT_RC(dcp__tz_parse_tensor_pickle(p, n, &t, &err), DCP_ENOTSUP);
    ASSERT(contains(err.msg, "quantized"));
    free(p);
}

TEST(parse_built_pickles)
{
    struct dcp_err err = {0};
    struct tz_tensor t;
    struct pspec s = default_spec();
    char longkey[TZ_MAX_NAME + 2];

    ASSERT_OK(parse_spec(&s, &t, &err));
    ASSERT_EQ(t.dtype, DCP_F32);
    ASSERT_EQ(t.ndim, 2);

    s = default_spec(); /* strides that run outside the storage */
    s.stride[0] = 4;
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_EFORMAT);
    ASSERT(contains(err.msg, "outside its storage"));
    s = default_spec();
    s.offset = 1;
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_EFORMAT);
    s.numel = 7;
    ASSERT_OK(parse_spec(&s, &t, &err));
    ASSERT_EQ(t.storage_offset, 1);
    s = default_spec();
    s.offset = -1;
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_EFORMAT);

    s = default_spec(); /* ndim 9 */
    s.nsize = s.nstride = 9;
    for (int i = 0; i < 9; i++)
        s.size[i] = 1, s.stride[i] = 1;
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_ELIMIT);
    s.nsize = s.nstride = 8;
    ASSERT_OK(parse_spec(&s, &t, &err));
    ASSERT_EQ(t.ndim, 8);

    s = default_spec(); /* negative size, negative stride */
    s.size[0] = -2;
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_EFORMAT);
    ASSERT(contains(err.msg, "negative"));
    s = default_spec();
    s.stride[1] = -1;
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_EFORMAT);
    s = default_spec();
    s.nstride = 1;
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_EFORMAT);

    s = default_spec(); /* overflowing extents */
    s.sname = "ByteStorage";
    s.numel = INT64_MAX;
    s.size[0] = 3;
    s.stride[0] = INT64_MAX / 2 + 1;
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_EFORMAT);
    s = default_spec();
    s.nsize = s.nstride = 3;
    s.size[0] = s.size[1] = s.size[2] = INT64_C(1) << 40;
    s.stride[0] = s.stride[1] = s.stride[2] = 0;
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_EFORMAT);
    s = default_spec(); /* storage byte counts: 8 * (2^63 - 1) overflows */
    s.sname = "DoubleStorage";
    s.numel = INT64_MAX;
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_EFORMAT);
    s.sname = "ByteStorage";
    ASSERT_OK(parse_spec(&s, &t, &err));
    ASSERT_U64_EQ(t.storage_numel, (uint64_t)INT64_MAX);

    s = default_spec(); /* empty tensors: any strides, offset in range */
    s.size[0] = 0;
    s.stride[0] = 1000;
    ASSERT_OK(parse_spec(&s, &t, &err));
    s.offset = 6;
    ASSERT_OK(parse_spec(&s, &t, &err));
    s.offset = 7;
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_EFORMAT);
    s = default_spec(); /* 0-d */
    s.nsize = s.nstride = 0;
    s.numel = 1;
    ASSERT_OK(parse_spec(&s, &t, &err));
    ASSERT_EQ(t.ndim, 0);
    s.numel = 0;
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_EFORMAT);
    s.numel = -1;
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_EFORMAT);

    s = default_spec(); /* v3 counts bytes */
    s.rebuild = "_rebuild_tensor_v3";
    s.smod = "torch.storage";
    s.sname = "UntypedStorage";
    s.dtype = "float32";
    s.numel = 24;
    ASSERT_OK(parse_spec(&s, &t, &err));
    ASSERT_EQ(t.dtype, DCP_F32);
    ASSERT_U64_EQ(t.storage_numel, 6);
    s.numel = 26;
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_EFORMAT);
    ASSERT(contains(err.msg, "whole number"));
    s.numel = 20;
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_EFORMAT);
    s.numel = 24;
    s.smod = "torch";
    ASSERT_OK(parse_spec(&s, &t, &err));
    s.dtype = "complex64"; /* 8-byte elements: 48 bytes hold the 6 */
    s.numel = 48;
    ASSERT_OK(parse_spec(&s, &t, &err));
    ASSERT_EQ(t.dtype, DCP_C64);
    ASSERT_U64_EQ(t.storage_numel, 6);
    s.numel = 24;
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_EFORMAT);
    s.dtype = "bits8";
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_ENOTSUP);
    ASSERT(contains(err.msg, "torch.bits8"));
    s.dtype = "float8_e5m2";
    ASSERT_OK(parse_spec(&s, &t, &err));
    ASSERT_EQ(t.dtype, DCP_F8_E5M2);
    ASSERT_U64_EQ(t.storage_numel, 24);
    s.dtype = NULL; /* v3 needs its dtype */
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_EFORMAT);
    s = default_spec(); /* v2 with an untyped storage: bytes */
    s.sname = "UntypedStorage";
    s.numel = 6;
    ASSERT_OK(parse_spec(&s, &t, &err));
    ASSERT_EQ(t.dtype, DCP_U8);

    s = default_spec(); /* metadata: empty is fine, conj bits are not */
    s.meta = 1;
    ASSERT_OK(parse_spec(&s, &t, &err));
    s.meta = 2;
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_ENOTSUP);
    s = default_spec();
    s.drop = 1;
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_EFORMAT);
    s = default_spec();
    s.size_wrap = 1;
    ASSERT_OK(parse_spec(&s, &t, &err));
    ASSERT_EQ(t.size[1], 3);

    s = default_spec(); /* storage persistent ids */
    s.tag = "storagx";
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_EFORMAT);
    s = default_spec();
    s.key = "";
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_EFORMAT);
    memset(longkey, 'k', sizeof(longkey) - 1);
    longkey[sizeof(longkey) - 1] = '\0';
    s.key = longkey;
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_EFORMAT);
    longkey[TZ_MAX_NAME] = '\0';
    ASSERT_OK(parse_spec(&s, &t, &err));
    ASSERT_EQ(strlen(t.key), TZ_MAX_NAME);
    s = default_spec();
    s.key = "17";
    ASSERT_OK(parse_spec(&s, &t, &err));
    ASSERT_STR_EQ(t.key, "17");
    s = default_spec();
    s.sname = "QInt8Storage";
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_ENOTSUP);
    s.sname = "EvilStorage";
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_EUNSAFE);
    s = default_spec();
    s.rebuild = "_rebuild_parameter";
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_EUNSAFE);
    s = default_spec();
    s.smod = "collections";
    s.sname = "OrderedDict"; /* allowed global, not a storage type */
    ASSERT_RC(parse_spec(&s, &t, &err), DCP_EFORMAT);
}

TEST(parse_hostile_pickles)
{
    static const char os_system[] =
        "\x80\x02"
        "cos\nsystem\nq\x00X\x02\x00\x00\x00lsq\x01\x85q\x02Rq\x03.";
    static const char not_tensor[] = "\x80\x02K\x07.";
    static const char list_pkl[] = "\x80\x02]q\x00(K\x01K\x02"
                                   "e.";
    struct dcp_err err = {0};
    struct tz_tensor t;
    size_t n;
    uint8_t *p;

    ASSERT_RC(
        dcp__tz_parse_tensor_pickle(os_system, sizeof(os_system) - 1, &t, &err),
        DCP_EUNSAFE);
    ASSERT(contains(err.msg, "data.pkl: "));
    ASSERT_RC(
        dcp__tz_parse_tensor_pickle(not_tensor, sizeof(not_tensor) - 1, &t, &err),
        DCP_EFORMAT);
    ASSERT_RC(dcp__tz_parse_tensor_pickle(list_pkl, sizeof(list_pkl) - 1, &t, &err),
              DCP_EFORMAT);
    ASSERT_RC(dcp__tz_parse_tensor_pickle("", 0, &t, &err), DCP_EFORMAT);
    ASSERT_RC(dcp__tz_parse_tensor_pickle(NULL, 3, &t, &err), DCP_EINVAL);

    /* the real f32 pickle with stride (4, 1): runs outside the storage */
    p = unhex(pkl_cases[0].hex, &n);
    for (size_t i = 0; i + 5 <= n; i++)
        if (memcmp(p + i, "\x4b\x03\x4b\x01\x86", 5) == 0)
            p[i + 1] = 4;
    ASSERT_RC(dcp__tz_parse_tensor_pickle(p, n, &t, &err), DCP_EFORMAT);
    ASSERT_EQ(t.ndim, 0); /* cleared on failure */
    /* every truncation of a real pickle fails cleanly */
    for (size_t k = 0; k < n; k++)
        ASSERT(dcp__tz_parse_tensor_pickle(p, k, &t, &err) != DCP_OK);
    free(p);
}

/* ------------------------------------------------------------------ */
/* Reader on hostile items                                            */
/* ------------------------------------------------------------------ */

static uint8_t *real_w(size_t *len)
{
    return load_file("torch_item_w.bin", len);
}

static int open_patched(const uint8_t *item, size_t len, struct dcp_err *err)
{
    struct tz_archive a;
    return open_mem(&a, item, len, err);
}

TEST(truncated_items)
{
    size_t len;
    uint8_t *item = real_w(&len);
    struct dcp_err err = {0};

    ASSERT(item != NULL);
    for (size_t k = 0; k < len; k++) {
        /* a copy of exactly k bytes, so ASan sees any overread */
        uint8_t *cut = malloc(k ? k : 1);
        int rc;
        memcpy(cut, item, k);
        rc = open_patched(cut, k, &err);
        free(cut);
        if (k < 22)
            ASSERT_RC(rc, DCP_ECORRUPT);
        else if (rc != DCP_EFORMAT)
            FAIL_AT_("truncated at %zu: %s", k, dcp_err_name(rc));
    }
    ASSERT_OK(open_patched(item, len, &err));
    free(item);
}

TEST(hostile_end_records)
{
    size_t len;
    uint8_t *item = real_w(&len), *p;
    struct dcp_err err = {0};
    size_t eocd, z64;

    ASSERT(item != NULL);
    eocd = len - 22;
    z64 = eocd - 20 - 56;
    p = malloc(len);

    memcpy(p, item, len); /* bad end record signature */
    p[eocd] ^= 0xFF;
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);
    ASSERT_STR_EQ(err.msg, "zip: bad end record signature at byte 1555");

    memcpy(p, item, len); /* directory past the end */
    put64(p + z64 + 48, len + 100);
    put32(p + eocd + 16, (uint32_t)len + 100);
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);
    ASSERT(contains(err.msg, "central directory at byte 1677"));
    put64(p + z64 + 48, UINT64_MAX - 10);
    put32(p + eocd + 16, 0xFFFFFFFFu);
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);

    memcpy(p, item, len); /* directory one byte off */
    put64(p + z64 + 48, dcp__le64(item + z64 + 48) - 1);
    put32(p + eocd + 16, 0xFFFFFFFFu);
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);

    memcpy(p, item, len); /* classic and zip64 disagree */
    put32(p + eocd + 16, dcp__le32(item + eocd + 16) + 1);
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);
    ASSERT(contains(err.msg, "disagrees"));

    memcpy(p, item, len); /* entry count 65535 */
    put16(p + eocd + 8, 0xFFFF);
    put16(p + eocd + 10, 0xFFFF);
    ASSERT_OK(open_patched(p, len, &err)); /* placeholders: zip64 counts */
    put64(p + z64 + 24, 65535);
    put64(p + z64 + 32, 65535);
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);
    ASSERT(contains(err.msg, "65535 entries"));
    put64(p + z64 + 24, 0);
    put64(p + z64 + 32, 0);
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);

    memcpy(p, item, len); /* no zip64 locator: the classic record rules */
    p[eocd - 20] ^= 0xFF;
    ASSERT_OK(open_patched(p, len, &err));
    put16(p + eocd + 10, 0xFFFF);
    put16(p + eocd + 8, 0xFFFF);
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);
    ASSERT(contains(err.msg, "no zip64 locator"));
    put16(p + eocd + 8, 7);
    put16(p + eocd + 10, 7);
    put16(p + eocd + 4, 1); /* multi-disk */
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);

    memcpy(p, item, len); /* zip64 record signature, locator offset */
    p[z64] ^= 0xFF;
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);
    memcpy(p, item, len);
    put64(p + eocd - 20 + 8, len);
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);
    memcpy(p, item, len);
    put64(p + z64 + 4, 1000); /* record size */
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);

    memcpy(p, item, len); /* a comment after the end record is fine */
    {
        uint8_t *q = malloc(len + 5);
        memcpy(q, item, len);
        memcpy(q + len, "hello", 5);
        put16(q + eocd + 20, 5);
        ASSERT_OK(open_patched(q, len + 5, &err));
        put16(q + eocd + 20, 4); /* comment length must reach the end */
        ASSERT_RC(open_patched(q, len + 5, &err), DCP_EFORMAT);
        free(q);
    }
    free(p);
    free(item);
}

TEST(hostile_directory_entries)
{
    size_t len, e0, e1, e6;
    uint8_t *item = real_w(&len), *p;
    struct dcp_err err = {0};

    ASSERT(item != NULL);
    p = malloc(len);
    e0 = cd_entry(item, len, 0);
    e1 = cd_entry(item, len, 1);
    e6 = cd_entry(item, len, 6);

    memcpy(p, item, len); /* compressed (deflate) */
    put16(p + e0 + 10, 8);
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);
    ASSERT(contains(err.msg, "compressed (method 8)"));
    memcpy(p, item, len); /* the local header alone says compressed */
    put16(p + 8, 8);
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);
    memcpy(p, item, len); /* encrypted */
    put16(p + e0 + 8, 0x0809);
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);

    memcpy(p, item, len); /* compressed size != size */
    put32(p + e0 + 20, dcp__le32(item + e0 + 20) + 1);
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);

    memcpy(p, item, len); /* data past the end */
    put32(p + e6 + 20, 0x10000);
    put32(p + e6 + 24, 0x10000);
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);
    ASSERT(contains(err.msg, "runs past"));
    put32(p + e6 + 20, 0xFFFFFFFEu);
    put32(p + e6 + 24, 0xFFFFFFFEu);
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);

    memcpy(p, item, len); /* data.pkl's data runs into the next record */
    put32(p + e0 + 20, 0xB0);
    put32(p + e0 + 24, 0xB0);
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);
    ASSERT(contains(err.msg, "overlap"));
    memcpy(p, item, len); /* two entries, one local header */
    put32(p + e1 + 42, 0);
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);

    memcpy(p, item, len); /* local header name mismatch */
    p[0xea + 30 + 12] = 'X';
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);
    ASSERT(contains(err.msg, "names 'archive/.forXat_version'"));
    memcpy(p, item, len); /* local name length mismatch */
    put16(p + 0xea + 26, 22);
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);
    memcpy(p, item, len); /* bad local signature */
    p[0xea] = 'Q';
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);
    memcpy(p, item, len); /* local header past the directory */
    put32(p + e1 + 42, (uint32_t)len - 10);
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);
    memcpy(p, item, len); /* bad directory signature */
    p[e1 + 1] = 'Q';
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);

    memcpy(p, item, len); /* NUL and backslash in names */
    p[e1 + 46 + 9] = '\0';
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);
    p[e1 + 46 + 9] = '\\';
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);
    memcpy(p, item, len); /* ".." */
    p[e1 + 46 + 9] = '.';
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);
    ASSERT(contains(err.msg, "'..'"));

    memcpy(p, item, len); /* zip64 placeholder without its extra */
    put32(p + e1 + 42, 0xFFFFFFFFu);
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);
    ASSERT(contains(err.msg, "zip64 extra"));
    memcpy(p, item, len);
    put16(p + e1 + 34, 1); /* disk 1 */
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);
    memcpy(p, item, len); /* a name that runs past the directory */
    put16(p + e6 + 28, 200);
    ASSERT_RC(open_patched(p, len, &err), DCP_EFORMAT);
    free(p);
    free(item);
}

/* Items dcp's own writer can produce with bad names. */
static int open_written(const char *const *names, size_t n, struct dcp_err *err)
{
    struct tz_writer w;
    struct dcp_buf img = {0};
    int rc = dcp__tz_writer_init(&w, 0, 64);
    for (size_t i = 0; rc == DCP_OK && i < n; i++)
        rc = dcp__tz_add(&w, names[i], "abc", 3);
    if (rc == DCP_OK)
        rc = dcp__tz_finish(&w);
    if (rc == DCP_OK)
        rc = drain(&w, &img);
    if (rc == DCP_OK)
        rc = open_patched(img.p, img.len, err);
    dcp__tz_writer_release(&w);
    dcp__buf_free(&img);
    return rc;
}

TEST(hostile_names)
{
    static const char *const ok[] = {"archive/data.pkl", "archive/x"};
    static const char *const dotdot[] = {"archive/data.pkl", "archive/../x"};
    static const char *const bslash[] = {"archive/data.pkl", "archive/a\\b"};
    static const char *const dup[] = {"archive/byteorder", "archive/x",
                                      "archive/byteorder"};
    static const char *const prefix[] = {"archive/data.pkl", "other/x"};
    static const char *const prefix2[] = {"archive/data.pkl", "archivex/y"};
    static const char *const noslash[] = {"data.pkl", "archive/x"};
    static const char *const lead[] = {"/data.pkl"};
    static const char *const bare[] = {"archive/"};
    struct dcp_err err = {0};

    ASSERT_OK(open_written(ok, 2, &err));
    ASSERT_RC(open_written(dotdot, 2, &err), DCP_EFORMAT);
    ASSERT_RC(open_written(bslash, 2, &err), DCP_EFORMAT);
    ASSERT_RC(open_written(dup, 3, &err), DCP_EFORMAT);
    ASSERT(contains(err.msg, "duplicate entry 'archive/byteorder'"));
    ASSERT_RC(open_written(prefix, 2, &err), DCP_EFORMAT);
    ASSERT_RC(open_written(prefix2, 2, &err), DCP_EFORMAT);
    ASSERT_RC(open_written(noslash, 2, &err), DCP_EFORMAT);
    ASSERT_RC(open_written(lead, 1, &err), DCP_EFORMAT);
    ASSERT_RC(open_written(bare, 1, &err), DCP_EFORMAT);
    ASSERT_RC(open_written(NULL, 0, &err), DCP_EFORMAT); /* no entries */
}

/* A tensor item of n uint8 bytes with block CRCs of bs bytes; *field
 * gets the item offset of data/0's block-CRC field (its ID). */
static uint8_t *blk_item(size_t n, uint64_t bs, size_t *len, size_t *field,
                         uint8_t **data)
{
    struct tz_writer w;
    struct dcp_buf img = {0};
    int64_t size = (int64_t)n;
    uint64_t data_off, nb = dcp__tz_block_count(n, bs);
    uint32_t *crc = calloc(nb + 1, sizeof(*crc));
    struct crc_blocks b;
    uint32_t whole;
    uint8_t *d = malloc(n + 1);
    if (!crc || !d)
        abort();
    for (size_t i = 0; i < n; i++)
        d[i] = (uint8_t)(i * 131u + (i >> 12));
    dcp__crcb_init(&b, bs, crc, nb);
    dcp__crcb_update(&b, NULL, d, n);
    whole = dcp__crcb_finish(&b);
    if (dcp__tz_writer_init(&w, 0, 64) != DCP_OK ||
        dcp__tz_writer_stream_align(&w, 4096) != DCP_OK ||
        dcp__tz_tensor_item_begin(&w, DCP_U8, 1, &size, n, &data_off) !=
            DCP_OK ||
        drain(&w, &img) != DCP_OK || dcp__buf_put(&img, d, n) != DCP_OK ||
        dcp__tz_tensor_item_end_blocks(&w, whole, bs, crc, (size_t)nb) !=
            DCP_OK ||
        drain(&w, &img) != DCP_OK)
        abort();
    dcp__tz_writer_release(&w);
    free(crc);
    *field = 0;
    for (size_t i = (size_t)data_off + n; i + 4 < img.len; i++)
        if (img.p[i] == 0x44 && img.p[i + 1] == 0x43 &&
            dcp__le16(img.p + i + 2) == 16 + 4 * nb) {
            *field = i;
            break;
        }
    *len = img.len;
    *data = d;
    return img.p;
}

/* The block-CRC field: exact bytes, read back, and what the reader finds. */
TEST(block_crc_field)
{
    const size_t n = (4u << 20) + 100; /* 5 blocks of 1 MiB, the last short */
    size_t len, f;
    uint8_t *d, *item = blk_item(n, 1u << 20, &len, &f, &d);
    const struct tz_entry *e;
    struct tz_archive a;
    struct dcp_err err = {0};
    struct mem m = {item, len, 0, 0, 0};
    uint32_t got[5];

    ASSERT(f > 0);
    /* ID "DC", length, version 1 + 3 zero bytes, block size, data size,
     * then the CRC-32 of each block. */
    ASSERT_EQ(dcp__le16(item + f), 0x4344);
    ASSERT_EQ(dcp__le16(item + f + 2), 16 + 20);
    ASSERT_MEM_EQ(item + f + 4, "\x01\x00\x00\x00\x00\x00\x10\x00", 8);
    ASSERT_U64_EQ(dcp__le64(item + f + 12), n);
    for (int k = 0; k < 5; k++) {
        size_t at = (size_t)k << 20, l = n - at < (1u << 20) ? n - at : 1u << 20;
        ASSERT_EQ(dcp__le32(item + f + 20 + 4 * k), dcp__crc32(0, d + at, l));
    }
    ASSERT_OK(dcp__tz_open(&a, len, mem_read, &m, &err));
    e = dcp__tz_find(&a, "data/0");
    ASSERT(e != NULL);
    ASSERT_U64_EQ(e->blk_size, 1u << 20);
    ASSERT_U64_EQ(e->blk_n, 5);
    ASSERT_U64_EQ(e->blk_at, f + 20);
    ASSERT_EQ(e->crc, dcp__crc32(0, d, n));
    ASSERT_OK(dcp__tz_read_block_crcs(e, 1, 4, mem_read, &m, got, &err));
    ASSERT_EQ(got[0], dcp__le32(item + f + 24));
    ASSERT_EQ(got[3], dcp__le32(item + f + 36));
    ASSERT_RC(dcp__tz_read_block_crcs(e, 2, 4, mem_read, &m, got, &err),
              DCP_EINVAL);
    ASSERT_EQ(dcp__tz_find(&a, "data.pkl")->blk_size, 0);
    /* The whole CRC still in the descriptor and the directory: the record
     * itself is checked as before. */
    {
        uint8_t *buf;
        ASSERT_OK(dcp__tz_read_entry(&a, e, n, 1, mem_read, &m, &buf, &err));
        ASSERT_MEM_EQ(buf, d, n);
        dcp__free(buf);
    }
    ASSERT(!m.oob);
    /* Writer misuse: a wrong count, block size, or no stream. */
    {
        struct tz_writer w;
        uint32_t c[3] = {0, 0, 0};
        uint64_t off;
        ASSERT_OK(dcp__tz_writer_init(&w, 0, 64));
        ASSERT_OK(dcp__tz_stream_begin(&w, "archive/x", 10000, &off));
        ASSERT_RC(dcp__tz_stream_end_blocks(&w, 0, 4096, c, 2), DCP_EINVAL);
        ASSERT_RC(dcp__tz_stream_end_blocks(&w, 0, 5000, c, 2), DCP_EINVAL);
        ASSERT_RC(dcp__tz_stream_end_blocks(&w, 0, 0x80000000u, c, 1),
                  DCP_EINVAL);
        ASSERT_OK(dcp__tz_stream_end_blocks(&w, 0, 4096, c, 3));
        ASSERT_RC(dcp__tz_stream_end_blocks(&w, 0, 4096, c, 3), DCP_EINVAL);
        dcp__tz_writer_release(&w);
    }
    ASSERT_U64_EQ(dcp__tz_block_size(0), 0);
    ASSERT_U64_EQ(dcp__tz_block_size(1), 1u << 20);
    ASSERT_U64_EQ(dcp__tz_block_size((uint64_t)8192 << 20), 1u << 20);
    ASSERT_U64_EQ(dcp__tz_block_size(((uint64_t)8192 << 20) + 1), 2u << 20);
    free(item);
    free(d);
}

/* Hostile block-CRC fields: refused with DCP_EFORMAT (malformed) or
 * DCP_ECORRUPT (CRCs that do not add up), never read outside the item. */
TEST(hostile_block_crc_fields)
{
    const size_t n = 3 * 4096 + 7; /* 4 blocks of 4 KiB */
    size_t len, f;
    uint8_t *d, *item = blk_item(n, 4096, &len, &f, &d);
    uint8_t *copy = malloc(len);
    struct tz_archive a;
    struct dcp_err err = {0};
    static const struct {
        size_t at;  /* offset in the field */
        int width;  /* 1, 2, 4 or 8 bytes */
        uint64_t v; /* written there */
        int rc;
        const char *msg;
    } cases[] = {
        {4, 1, 2, DCP_EFORMAT, "version"},           /* version 2 */
        {6, 1, 1, DCP_EFORMAT, "version"},           /* reserved byte */
        {8, 4, 0, DCP_EFORMAT, "block size 0"},      /* block size 0 */
        {8, 4, 2048, DCP_EFORMAT, "block size 2048"},
        {8, 4, 6144, DCP_EFORMAT, "block size 6144"},
        {8, 4, 0x80000000u, DCP_EFORMAT, "block size 2147483648"},
        {8, 4, 0xFFFFFFFFu, DCP_EFORMAT, "block size"},
        {8, 4, 8192, DCP_EFORMAT, "2 blocks of 8192"}, /* count */
        {12, 8, 3 * 4096 + 8, DCP_EFORMAT, "covers"},  /* data size */
        {12, 8, ~0ull, DCP_EFORMAT, "covers"},
        {2, 2, 16 + 12, DCP_EFORMAT, "holds 12 bytes"}, /* shorter */
        {2, 2, 15, DCP_EFORMAT, "19 bytes"},             /* below the head */
        {2, 2, 0xFFFF, DCP_EFORMAT, "running past"},
        {2, 2, 16 + 17, DCP_EFORMAT, "running past"},
        {20, 1, 0x5A, DCP_ECORRUPT, "do not combine"}, /* a CRC */
        {32, 4, 0x80000000u, DCP_ECORRUPT, "do not combine"},
    };
    ASSERT(f > 0 && copy);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memcpy(copy, item, len);
        /* Little-endian v written there (CRC cases: XORed into it). */
        for (int k = 0; k < cases[i].width; k++) {
            uint8_t v = (uint8_t)(cases[i].v >> (8 * k));
            if (cases[i].rc == DCP_ECORRUPT)
                copy[f + cases[i].at + k] ^= v;
            else
                copy[f + cases[i].at + k] = v;
        }
        ASSERT_RC(open_mem(&a, copy, len, &err), cases[i].rc);
        if (!contains(err.msg, cases[i].msg))
            fprintf(stderr, "case %zu: %s\n", i, err.msg);
        ASSERT(contains(err.msg, cases[i].msg));
        ASSERT(contains(err.msg, "archive/data/0") ||
               contains(err.msg, "entry at byte"));
    }
    /* Unchanged, it opens. */
    ASSERT_OK(open_mem(&a, item, len, &err));
    free(copy);
    free(item);
    free(d);
}

TEST(crc_and_read_errors)
{
    size_t len;
    uint8_t *item = real_w(&len), *buf;
    struct tz_archive a;
    struct dcp_err err = {0};
    struct mem m;

    ASSERT(item != NULL);
    item[0x2c0 + 5] ^= 1; /* a byte of data/0 */
    m = (struct mem){item, len, 0, 0, 0};
    ASSERT_OK(dcp__tz_open(&a, len, mem_read, &m, &err));
    ASSERT_RC(dcp__tz_read_entry(&a, dcp__tz_find(&a, "data/0"), 24, 1, mem_read, &m,
                            &buf, &err),
              DCP_ECORRUPT);
    ASSERT(buf == NULL);
    ASSERT(contains(err.msg, "crc mismatch in 'archive/data/0'"));
    ASSERT_OK(dcp__tz_read_entry(&a, dcp__tz_find(&a, "data/0"), 24, 0, mem_read, &m,
                            &buf, &err));
    dcp__free(buf);
    item[0x2c0 + 5] ^= 1;

    for (int k = 1;; k++) {
        int rc;
        m = (struct mem){item, len, 0, 0, k};
        rc = dcp__tz_open(&a, len, mem_read, &m, &err);
        if (m.calls < k) {
            ASSERT_OK(rc);
            break;
        }
        ASSERT_RC(rc, DCP_EIO);
        ASSERT_STR_EQ(err.msg, "injected read failure");
        ASSERT_EQ(a.n, 0);
    }
    m = (struct mem){item, len, 0, 0, 0};
    ASSERT_OK(dcp__tz_open(&a, len, mem_read, &m, &err));
    m.fail_at = m.calls + 1;
    ASSERT_RC(dcp__tz_read_entry(&a, dcp__tz_find(&a, "data/0"), 24, 1, mem_read, &m,
                            &buf, &err),
              DCP_EIO);
    ASSERT(buf == NULL);
    ASSERT_RC(dcp__tz_open(NULL, len, mem_read, &m, &err), DCP_EINVAL);
    ASSERT_RC(dcp__tz_open(&a, len, NULL, &m, &err), DCP_EINVAL);
    free(item);
}

TEST(allocation_failures)
{
    size_t len;
    uint8_t *item = real_w(&len), *buf = NULL;
    struct dcp_err err = {0};
    int64_t sizes[2] = {2, 3};
    int done = 0;

    ASSERT(item != NULL);
    for (uint64_t k = 1; !done && k < 10000; k++) {
        struct tz_archive a;
        struct mem m = {item, len, 0, 0, 0};
        struct dcp_buf img = {0};
        struct tz_tensor t;
        uint64_t off;
        int rc;

        (void)dcp__alloc_fail_after(k);
        rc = dcp__tz_open(&a, len, mem_read, &m, &err);
        if (rc == DCP_OK)
            rc = dcp__tz_read_entry(&a, dcp__tz_find(&a, "data.pkl"), 4096, 1, mem_read,
                               &m, &buf, &err);
        if (rc == DCP_OK) {
            rc = dcp__tz_parse_tensor_pickle(buf, dcp__tz_find(&a, "data.pkl")->size, &t,
                                        &err);
            dcp__free(buf);
        }
        if (rc == DCP_OK)
            rc = write_tensor_item(&img, 0, 64, DCP_F32, 2, sizes, arange6, 24,
                                   &off);
        (void)dcp__alloc_fail_after(0);
        dcp__buf_free(&img);
        if (rc == DCP_OK)
            done = 1;
        else
            ASSERT_RC(rc, DCP_ENOMEM);
    }
    ASSERT(done);
    free(item);
}

TEST(random_byte_flips)
{
    /* fixed seed; no crash, no read outside the item, only clean codes */
    size_t len;
    uint8_t *item = real_w(&len), *p;
    uint64_t seed = 0xC0FFEE;
    int opened = 0, parsed = 0;

    ASSERT(item != NULL);
    p = malloc(len);
    for (int trial = 0; trial < 20000; trial++) {
        struct tz_archive a;
        struct dcp_err err = {0};
        struct mem m = {p, len, 0, 0, 0};
        int flips, rc;

        memcpy(p, item, len);
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        flips = 1 + (int)((seed >> 60) & 3);
        for (int f = 0; f < flips; f++) {
            size_t at;
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            /* half the trials aim at data.pkl's bytes */
            at = trial & 1 ? (size_t)(seed >> 33) % len
                           : 64 + (size_t)(seed >> 33) % 0x9a;
            p[at] = (uint8_t)(seed >> 20);
        }
        rc = dcp__tz_open(&a, len, mem_read, &m, &err);
        ASSERT_EQ(m.oob, 0);
        if (rc != DCP_OK) {
            ASSERT(rc == DCP_EFORMAT || rc == DCP_ECORRUPT);
            continue;
        }
        opened++;
        for (size_t i = 0; i < a.n; i++) {
            uint8_t *buf = NULL;
            int verify = strcmp(a.ent[i].name, "data.pkl") != 0;
            rc = dcp__tz_read_entry(&a, &a.ent[i], 1 << 16, verify, mem_read, &m,
                               &buf, &err);
            ASSERT_EQ(m.oob, 0);
            if (rc == DCP_OK && !verify) {
                struct tz_tensor t;
                rc = dcp__tz_parse_tensor_pickle(buf, (size_t)a.ent[i].size, &t,
                                            &err);
                if (rc == DCP_OK) {
                    parsed++;
                    ASSERT(t.ndim >= 0 && t.ndim <= DCP_MAX_NDIM);
                }
            }
            dcp__free(buf);
        }
    }
    fprintf(stderr, "     %d of 20000 mutants opened, %d parsed\n", opened,
            parsed);
    free(p);
    free(item);
}

int main(void)
{
    RUN(tensor_pickle_matches_torch);
    RUN(tensor_pickle_rejects_bad_arguments);
    RUN(tensor_item_f32_matches_torch);
    RUN(tensor_item_f8_matches_torch);
    RUN(tensor_item_zero_size_matches_torch);
    RUN(value_item_matches_torch);
    RUN(zip64_item_matches_torch);
    RUN(zip64_header_matches_torch);
    RUN(zip64_both_size_and_offset);
    RUN(alignment_is_absolute);
    RUN(random_items_round_trip);
    RUN(writer_misuse);
    RUN(open_real_items);
    RUN(parse_real_f32);
    RUN(parse_real_f8);
    RUN(parse_torch_pickles);
    RUN(parse_built_pickles);
    RUN(parse_hostile_pickles);
    RUN(truncated_items);
    RUN(hostile_end_records);
    RUN(hostile_directory_entries);
    RUN(hostile_names);
    RUN(crc_and_read_errors);
    RUN(block_crc_field);
    RUN(hostile_block_crc_fields);
    RUN(allocation_failures);
    RUN(random_byte_flips);
    return TEST_SUMMARY();
}
