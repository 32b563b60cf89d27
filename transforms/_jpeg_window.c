/* feedline.transforms._jpeg_window: decode only a window of a JPEG, through libjpeg-turbo's libjpeg API.
 *
 * decode_into(data, out, top, left, height, width, scale_denom) -> bool
 *
 *   data   the JPEG's bytes (any object with the buffer protocol; read only)
 *   out    a writable C-contiguous uint8 buffer, laid out (rows, columns, RGB), of exactly one of two sizes:
 *          the image's, H' x W' x 3 (H' x W' being its size at 1/scale_denom, libjpeg's rounding up), where each
 *          window row is written where it lies in the image and the pixels outside the window (but for a column
 *          or an iMCU around it) are left as they were; or the window's, height x width x 3, which receives the
 *          window alone
 *   top, left, height, width   the window, in pixels of the image at 1/scale_denom
 *
 * Only the window's rows are decoded (jpeg_skip_scanlines above, jpeg_abort_decompress below), and in those rows
 * only the iMCU columns around the window (jpeg_crop_scanline), so the window holds the same pixels as a full
 * decode would. The window is widened by one column on each side first: libjpeg's smooth chroma upsampling
 * reads one neighbour, which a crop's edge column would otherwise replicate.
 *
 * Returns False, with `out` untouched, for what it does not take: a colour space other than YCbCr, RGB or
 * grayscale (CMYK, YCCK), data that does not end with the EOI marker (a truncated file, or bytes after the image,
 * which a full decode has to judge), an image whose size at this scale is not out's, and damage: a warning from
 * libjpeg while it decoded (corrupt data it decodes through), or a marker in the rest of a one-scan file that a
 * full decode would stop at. Raises JpegError for what libjpeg refuses. libjpeg's error_exit is replaced, so no
 * input can make it call exit(); its warnings are counted, not printed. Runs without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>

#define DONE 0
#define DECLINED 1
#define FAILED -1
#define CHUNK 16 /* rows per jpeg_read_scanlines call */

static PyObject *JpegError;

struct window_error {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
};

static void on_error(j_common_ptr cinfo) {
    struct window_error *err = (struct window_error *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    if (level < 0) cinfo->err->num_warnings++; /* kept quiet: torchvision's decoder decodes through them too */
}

/* The source: the caller's bytes. Running out of them is an error, never libjpeg's inserted fake EOI. */
static void source_init(j_decompress_ptr cinfo) { (void)cinfo; }
static void source_term(j_decompress_ptr cinfo) { (void)cinfo; }

static boolean source_fill(j_decompress_ptr cinfo) {
    struct window_error *err = (struct window_error *)cinfo->err;
    snprintf(err->message, sizeof err->message, "Image is incomplete or truncated");
    longjmp(err->jump, 1);
    return FALSE;
}

static void source_skip(j_decompress_ptr cinfo, long count) {
    struct jpeg_source_mgr *src = cinfo->src;
    if (count <= 0) return;
    if ((size_t)count > src->bytes_in_buffer) source_fill(cinfo);
    src->next_input_byte += count;
    src->bytes_in_buffer -= (size_t)count;
}

/* Whether the bytes from `p` on hold only what may follow the rows libjpeg has read in a one-scan file: entropy-
 * coded data (FF 00 stuffing, RSTn markers, FF fill bytes) and the end marker the file ends with (checked before).
 * Another marker there (a table, a frame, a scan, a second image) makes a full decode stop or refuse the file. In a
 * file of several scans libjpeg has read to the end marker before the first row, so nothing is left to check. */
static int clean_tail(const JOCTET *p, const JOCTET *end) {
    end -= 2; /* the final FF D9 */
    while (p < end) {
        const JOCTET *ff = memchr(p, 0xFF, (size_t)(end - p));
        if (ff == NULL) return 1;
        const JOCTET *q = ff + 1;
        while (q < end && *q == 0xFF) q++; /* fill bytes */
        if (q >= end) return 1;
        if (*q != 0x00 && (*q < 0xD0 || *q > 0xD7)) return 0;
        p = q + 1;
    }
    return 1;
}

/* A progressive file whose scans leave some coefficient of some component unrefined (cut short, its end marker
 * restored, or written so): libjpeg then smooths the blocks, and libjpeg-turbo's versions differ in how, so the
 * full decode makes its pixels. libjpeg has read every scan by now (jpeg_start_decompress reads a file of several
 * scans to its end). */
static int incomplete(j_decompress_ptr cinfo) {
    if (!cinfo->progressive_mode || cinfo->coef_bits == NULL) return 0;
    for (int ci = 0; ci < cinfo->num_components; ci++)
        for (int k = 0; k < DCTSIZE2; k++)
            if (cinfo->coef_bits[ci][k] != 0) return 1;
    return 0;
}

struct window {
    const unsigned char *data;
    size_t length;
    unsigned char *out;
    size_t out_length;
    long top, left, height, width;
    int denom;
};

/* DONE, DECLINED or FAILED (message set). Calls nothing of Python's: it runs without the GIL. */
static int decode_window(const struct window *w, char *message, size_t message_size) {
    struct jpeg_decompress_struct cinfo;
    struct window_error err;
    struct jpeg_source_mgr source;
    /* volatile: read after a longjmp */
    volatile int created = 0;

    if (w->length < 4 || w->data[w->length - 2] != 0xFF || w->data[w->length - 1] != 0xD9) return DECLINED;
    memset(&cinfo, 0, sizeof cinfo);
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    err.message[0] = '\0';
    if (setjmp(err.jump)) {
        if (created) jpeg_destroy_decompress(&cinfo);
        snprintf(message, message_size, "%s", err.message);
        return FAILED;
    }
    jpeg_create_decompress(&cinfo);
    created = 1;
    source.next_input_byte = w->data;
    source.bytes_in_buffer = w->length;
    source.init_source = source_init;
    source.fill_input_buffer = source_fill;
    source.skip_input_data = source_skip;
    source.resync_to_restart = jpeg_resync_to_restart;
    source.term_source = source_term;
    cinfo.src = &source;
    jpeg_read_header(&cinfo, TRUE);
    if (cinfo.jpeg_color_space != JCS_YCbCr && cinfo.jpeg_color_space != JCS_RGB &&
        cinfo.jpeg_color_space != JCS_GRAYSCALE) {
        jpeg_destroy_decompress(&cinfo);
        return DECLINED;
    }
    cinfo.out_color_space = JCS_RGB;
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned int)w->denom;
    cinfo.dct_method = JDCT_ISLOW; /* torchvision's: the pixels must match its full decode */
    jpeg_calc_output_dimensions(&cinfo);
    size_t out_h = cinfo.output_height, out_w = cinfo.output_width;
    size_t window_bytes = (size_t)w->height * (size_t)w->width * 3;
    int whole = out_h * out_w * 3 == w->out_length; /* else the window alone */
    if (cinfo.output_components != 3 || (!whole && window_bytes != w->out_length) ||
        (size_t)w->top + w->height > out_h || (size_t)w->left + w->width > out_w) {
        jpeg_destroy_decompress(&cinfo);
        return DECLINED;
    }
    jpeg_start_decompress(&cinfo);
    if (incomplete(&cinfo)) { /* libjpeg would smooth what its scans left out, as versions differ in doing */
        jpeg_destroy_decompress(&cinfo);
        return DECLINED;
    }
    /* one column of margin each side, then libjpeg widens the columns to whole iMCUs */
    JDIMENSION first = (JDIMENSION)(w->left > 0 ? w->left - 1 : 0);
    size_t end = (size_t)w->left + (size_t)w->width + 1;
    JDIMENSION last = (JDIMENSION)(end < out_w ? end : out_w);
    JDIMENSION columns = last - first;
    /* libjpeg-turbo gives a crop whose chroma would be under 2 samples wide plain (box) upsampling, which the full
     * decode does not use (a 1-column window at the left edge of a 4:2:0 image): keep it max_h_samp + 1 wide */
    JDIMENSION least = (JDIMENSION)cinfo.max_h_samp_factor + 1;
    if (columns < least && out_w >= least) {
        if ((size_t)first + least > out_w) first = (JDIMENSION)out_w - least;
        columns = least;
    }
    jpeg_crop_scanline(&cinfo, &first, &columns);
    if ((size_t)first + columns > out_w) { /* libjpeg keeps the window inside the image; never write past a row */
        jpeg_destroy_decompress(&cinfo);
        snprintf(message, message_size, "libjpeg widened the window past the image");
        return FAILED;
    }
    /* Rows are read CHUNK at a time (fewer calls) into a staging block of the window's rows (freed with cinfo), each
     * row at an address of its own: reusing a few scratch rows for every row measured up to 1.5x slower in
     * libjpeg-turbo 2.1, by where they happened to lie. Nothing reaches `out` before the checks at the end. */
    size_t pitch = (size_t)columns * 3;
    JSAMPLE *staging =
        (JSAMPLE *)(*cinfo.mem->alloc_large)((j_common_ptr)&cinfo, JPOOL_IMAGE, (size_t)w->height * pitch);
    JSAMPROW lines[CHUNK];
    size_t offset = ((size_t)w->left - first) * 3, row_bytes = (size_t)w->width * 3, stride = out_w * 3;
    if (w->top > 0) {
        JDIMENSION skipped = jpeg_skip_scanlines(&cinfo, (JDIMENSION)w->top);
        if (skipped != (JDIMENSION)w->top) {
            jpeg_destroy_decompress(&cinfo);
            snprintf(message, message_size, "libjpeg skipped %u of %ld rows", skipped, w->top);
            return FAILED;
        }
    }
    for (long row = w->top, end_row = w->top + w->height; row < end_row;) {
        JDIMENSION want = (JDIMENSION)(end_row - row < CHUNK ? end_row - row : CHUNK), got = 0;
        for (JDIMENSION k = 0; k < want; k++) lines[k] = staging + (size_t)(row - w->top + k) * pitch;
        while (got < want) {
            JDIMENSION read = jpeg_read_scanlines(&cinfo, lines + got, want - got);
            if (read == 0) {
                jpeg_destroy_decompress(&cinfo);
                snprintf(message, message_size, "libjpeg returned no row %ld", row + (long)got);
                return FAILED;
            }
            got += read;
        }
        row += (long)got;
    }
    /* Damage libjpeg decoded through (its warnings), or a marker in the rest of a one-scan file that a full decode
     * would stop at: the full decode judges the file, and its pixels are the ones a damaged file gets. */
    int clean = err.pub.num_warnings == 0 &&
                clean_tail(cinfo.src->next_input_byte, w->data + w->length);
    if (clean) /* before the abort, which frees the staging block with the image's pool */
        for (long k = 0; k < w->height; k++) {
            const JSAMPLE *line = staging + (size_t)k * pitch;
            if (whole)
                memcpy(w->out + (size_t)(w->top + k) * stride + (size_t)first * 3, line, pitch);
            else
                memcpy(w->out + (size_t)k * row_bytes, line + offset, row_bytes);
        }
    jpeg_abort_decompress(&cinfo); /* the rows below the window are never decoded */
    jpeg_destroy_decompress(&cinfo);
    return clean ? DONE : DECLINED;
}

static PyObject *decode_into(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data, out;
    struct window w;
    char message[JMSG_LENGTH_MAX + 64];
    int result;
    if (!PyArg_ParseTuple(args, "y*w*lllli", &data, &out, &w.top, &w.left, &w.height, &w.width, &w.denom))
        return NULL;
    if (!PyBuffer_IsContiguous(&out, 'C') || w.top < 0 || w.left < 0 || w.height < 1 || w.width < 1 ||
        (w.denom != 1 && w.denom != 2 && w.denom != 4 && w.denom != 8)) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&out);
        PyErr_Format(PyExc_ValueError,
                     "decode_into: a window of top %ld, left %ld, height %ld, width %ld at 1/%d into a buffer of "
                     "%zd bytes: the window must lie in the image, at 1/1, 1/2, 1/4 or 1/8, in a C-contiguous buffer",
                     w.top, w.left, w.height, w.width, w.denom, out.len);
        return NULL;
    }
    w.data = data.buf;
    w.length = (size_t)data.len;
    w.out = out.buf;
    w.out_length = (size_t)out.len;
    message[0] = '\0';
    Py_BEGIN_ALLOW_THREADS
    result = decode_window(&w, message, sizeof message);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    if (result == FAILED) {
        PyErr_SetString(JpegError, message);
        return NULL;
    }
    return PyBool_FromLong(result == DONE);
}

static PyMethodDef methods[] = {
    {"decode_into", decode_into, METH_VARARGS,
     "decode_into(data, out, top, left, height, width, scale_denom) -> bool: decode a window of a JPEG into out, "
     "uint8 (H', W', 3) of the image's size where it lies in the image, or (height, width, 3) alone; False where "
     "the data is not one this decoder takes"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpeg_window",
                                    "Crop-window JPEG decoding (libjpeg-turbo)", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__jpeg_window(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    JpegError = PyErr_NewException("feedline.transforms._jpeg_window.JpegError", PyExc_ValueError, NULL);
    if (JpegError == NULL || PyModule_AddObject(m, "JpegError", JpegError) < 0) {
        Py_XDECREF(JpegError);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(JpegError);
#ifdef LIBJPEG_TURBO_VERSION_NUMBER
    long turbo = LIBJPEG_TURBO_VERSION_NUMBER; /* 2001005: libjpeg-turbo 2.1.5, the headers built against */
#else
    long turbo = 0;
#endif
    if (PyModule_AddIntConstant(m, "LIBJPEG_VERSION", JPEG_LIB_VERSION) < 0 ||
        PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION", turbo) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
