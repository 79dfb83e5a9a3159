/*
 * txnstream._native: the buffer owner's scan of its data partitions, in C.
 *
 * The owner folds every record of the partitions it serves. Read through confluent-kafka,
 * each record costs a Python Message object (topic, key and value copies, a header list)
 * before the fold looks at two of its headers. This scan reads the same records from
 * librdkafka's queue and hands Python one entry per *run*: consecutive offsets of one
 * partition that are
 *   - all PLAIN: no txn.id, no txn.marker and no delay header (txn.deliver.at or
 *     txn.deliver.after); other (user) headers do not matter;
 *   - all DELAYED: plain (no txn.id, no txn.marker) with a delay header, byte-equal
 *     headers (same names and values, in the same order) and the same timestamp (a
 *     plain record's due time may count from it);
 *   - all TXN: a txn.id and no txn.marker (a delay header or not), and byte-equal
 *     headers (one txn's records);
 *   - or a single MARKER: a record with a txn.marker header comes alone, with its
 *     headers and value, so Python folds it by its own rules.
 *
 * An entry is the tuple (topic, partition, first, last, headers, value, timestamp):
 * headers is None for a PLAIN run, else the list of (name, value) of the run's first
 * record; value is the record's value for a record with a txn.marker header, else None;
 * timestamp is the first record's (-1 if none). txnstream/buffer/runs.py (runs_of)
 * builds the same entries in pure Python (the fallback of txnstream/buffer/scan.py), and
 * `coalesce()` here runs this file's rules on records given from Python:
 * tests/unit/buffer/test_native_scan.py checks both agree.
 *
 * librdkafka is the one confluent-kafka loaded (load() opens it by path and checks its
 * version against confluent-kafka's), so the consumer handle is shared: the scan takes
 * the rd_kafka_t of a confluent_kafka.Consumer (the first field after PyObject_HEAD of
 * confluent-kafka's Handle, checked by the handle's type and name) and reads its own
 * queue, to which attach() forwards a partition's fetch queue. Logs, errors and
 * rebalances stay on the consumer's queue, served by confluent-kafka's own poll.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

/* ---- the part of librdkafka's public ABI used here (rdkafka.h, stable since 0.11) ---- */
typedef struct rd_kafka_s rd_kafka_t;
typedef struct rd_kafka_topic_s rd_kafka_topic_t;
typedef struct rd_kafka_queue_s rd_kafka_queue_t;
typedef struct rd_kafka_headers_s rd_kafka_headers_t;
typedef struct rd_kafka_op_s rd_kafka_event_t;
typedef int rd_kafka_resp_err_t;
typedef struct {
    rd_kafka_resp_err_t err;
    rd_kafka_topic_t *rkt;
    int32_t partition;
    void *payload;
    size_t len;
    void *key;
    size_t key_len;
    int64_t offset;
    void *_private;
} rd_kafka_message_t;
typedef struct {
    char *topic;
    int32_t partition;
    int64_t offset;
    void *metadata;
    size_t metadata_size;
    void *opaque;
    rd_kafka_resp_err_t err;
    void *_private;
} rd_kafka_topic_partition_t;
typedef struct rd_kafka_AdminOptions_s rd_kafka_AdminOptions_t;
typedef struct rd_kafka_TopicCollection_s rd_kafka_TopicCollection_t;
typedef struct rd_kafka_TopicDescription_s rd_kafka_TopicDescription_t;
typedef struct rd_kafka_Uuid_s rd_kafka_Uuid_t;
typedef struct rd_kafka_error_s rd_kafka_error_t;
typedef rd_kafka_event_t rd_kafka_DescribeTopics_result_t;
#define RD_KAFKA_CONSUMER 1
#define RD_KAFKA_ADMIN_OP_ANY 0
#define RD_KAFKA_RESP_ERR__PARTITION_EOF (-191)
#define RD_KAFKA_EVENT_FETCH 0x2
#define RD_KAFKA_EVENT_ERROR 0x8

static struct {
    int (*version)(void);
    int (*type)(const rd_kafka_t *);
    const char *(*name)(const rd_kafka_t *);
    rd_kafka_queue_t *(*queue_new)(rd_kafka_t *);
    void (*queue_destroy)(rd_kafka_queue_t *);
    rd_kafka_queue_t *(*queue_get_partition)(rd_kafka_t *, const char *, int32_t);
    rd_kafka_queue_t *(*queue_get_consumer)(rd_kafka_t *);
    void (*queue_forward)(rd_kafka_queue_t *, rd_kafka_queue_t *);
    rd_kafka_event_t *(*queue_poll)(rd_kafka_queue_t *, int);
    void (*queue_io_event_enable)(rd_kafka_queue_t *, int, const void *, size_t);
    int (*event_type)(const rd_kafka_event_t *);
    const rd_kafka_message_t *(*event_message_next)(rd_kafka_event_t *);
    rd_kafka_resp_err_t (*event_error)(rd_kafka_event_t *);
    const char *(*event_error_string)(rd_kafka_event_t *);
    void (*event_destroy)(rd_kafka_event_t *);
    rd_kafka_topic_partition_t *(*event_topic_partition)(rd_kafka_event_t *);
    void (*topic_partition_destroy)(rd_kafka_topic_partition_t *);
    const char *(*topic_name)(const rd_kafka_topic_t *);
    int64_t (*message_timestamp)(const rd_kafka_message_t *, int *);
    rd_kafka_resp_err_t (*message_headers)(const rd_kafka_message_t *, rd_kafka_headers_t **);
    rd_kafka_resp_err_t (*header_get_all)(const rd_kafka_headers_t *, size_t, const char **,
                                          const void **, size_t *);
    const char *(*err2str)(rd_kafka_resp_err_t);
    rd_kafka_AdminOptions_t *(*AdminOptions_new)(rd_kafka_t *, int);
    rd_kafka_resp_err_t (*AdminOptions_set_request_timeout)(rd_kafka_AdminOptions_t *, int,
                                                            char *, size_t);
    void (*AdminOptions_destroy)(rd_kafka_AdminOptions_t *);
    rd_kafka_TopicCollection_t *(*TopicCollection_of_topic_names)(const char **, size_t);
    void (*TopicCollection_destroy)(rd_kafka_TopicCollection_t *);
    void (*DescribeTopics)(rd_kafka_t *, const rd_kafka_TopicCollection_t *,
                           const rd_kafka_AdminOptions_t *, rd_kafka_queue_t *);
    const rd_kafka_DescribeTopics_result_t *(*event_DescribeTopics_result)(rd_kafka_event_t *);
    const rd_kafka_TopicDescription_t **(*DescribeTopics_result_topics)(
        const rd_kafka_DescribeTopics_result_t *, size_t *);
    const char *(*TopicDescription_name)(const rd_kafka_TopicDescription_t *);
    const rd_kafka_Uuid_t *(*TopicDescription_topic_id)(const rd_kafka_TopicDescription_t *);
    const rd_kafka_error_t *(*TopicDescription_error)(const rd_kafka_TopicDescription_t *);
    rd_kafka_resp_err_t (*error_code)(const rd_kafka_error_t *);
    const char *(*Uuid_base64str)(const rd_kafka_Uuid_t *);
} rk;
static void *rk_lib = NULL;
static PyTypeObject *consumer_type = NULL; /* confluent_kafka.Consumer */

/* ---- a record as the rules see it ---- */
typedef struct {
    const char *name;
    Py_ssize_t name_len;
    const void *value; /* NULL: a null header value */
    size_t size;
} hdr_t;

typedef struct {
    hdr_t *h;
    size_t n, cap;
} hdrs_t;

static int hdrs_push(hdrs_t *hs, const char *name, Py_ssize_t name_len, const void *value,
                     size_t size) {
    if (hs->n == hs->cap) {
        size_t cap = hs->cap ? hs->cap * 2 : 8;
        hdr_t *h = PyMem_Realloc(hs->h, cap * sizeof(hdr_t));
        if (h == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        hs->h = h;
        hs->cap = cap;
    }
    hs->h[hs->n++] = (hdr_t){name, name_len, value, size};
    return 0;
}

static int hdrs_equal(const hdrs_t *a, const hdrs_t *b) {
    if (a->n != b->n)
        return 0;
    for (size_t i = 0; i < a->n; i++) {
        const hdr_t *x = &a->h[i], *y = &b->h[i];
        if (x->name_len != y->name_len || memcmp(x->name, y->name, x->name_len) != 0)
            return 0;
        if ((x->value == NULL) != (y->value == NULL) || x->size != y->size)
            return 0;
        if (x->value != NULL && x->size && memcmp(x->value, y->value, x->size) != 0)
            return 0;
    }
    return 1;
}

enum kind { PLAIN, DELAYED, TXN, SINGLE };

static int is_name(const hdr_t *h, const char *name) {
    size_t n = strlen(name);
    return (size_t)h->name_len == n && memcmp(h->name, name, n) == 0;
}

/* Plain: no txn.id, no txn.marker and no delay header. Delayed: no txn.id and no
 * txn.marker, and a txn.deliver.at or txn.deliver.after header. A txn record: a txn.id
 * and no txn.marker (a delay header or not). Anything with a txn.marker comes alone
 * (with its value). Header names as in txnstream/message.py. */
static enum kind classify(const hdrs_t *hs, int *marker) {
    int id = 0, delay = 0;
    *marker = 0;
    for (size_t i = 0; i < hs->n; i++) {
        if (is_name(&hs->h[i], "txn.id"))
            id = 1;
        else if (is_name(&hs->h[i], "txn.marker"))
            *marker = 1;
        else if (is_name(&hs->h[i], "txn.deliver.at") ||
                 is_name(&hs->h[i], "txn.deliver.after"))
            delay = 1;
    }
    if (*marker)
        return SINGLE;
    if (id)
        return TXN;
    return delay ? DELAYED : PLAIN;
}

/* ---- runs ---- */
typedef struct {
    PyObject *out; /* the entries */
    int open;
    enum kind kind;
    PyObject *topic; /* borrowed: alive for the whole call */
    int32_t partition;
    int64_t first, last, ts;
    hdrs_t hdrs; /* the run's first record's headers (pointing into its record): what a
                  * DELAYED or TXN run's next records must equal, byte for byte */
    PyObject *value;  /* new reference or NULL */
} runs_t;

static PyObject *headers_list(const hdrs_t *hs) {
    PyObject *list = PyList_New((Py_ssize_t)hs->n);
    if (list == NULL)
        return NULL;
    for (size_t i = 0; i < hs->n; i++) {
        const hdr_t *h = &hs->h[i];
        PyObject *v;
        if (h->value == NULL) {
            v = Py_NewRef(Py_None);
        } else {
            v = PyBytes_FromStringAndSize(h->value, (Py_ssize_t)h->size);
        }
        PyObject *item = v ? Py_BuildValue("(s#N)", h->name, h->name_len, v) : NULL;
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    return list;
}

static int runs_flush(runs_t *r) {
    if (!r->open)
        return 0;
    r->open = 0;
    PyObject *headers = r->kind == PLAIN ? Py_NewRef(Py_None) : headers_list(&r->hdrs);
    PyObject *value = r->value ? r->value : Py_NewRef(Py_None);
    r->value = NULL;
    if (headers == NULL) {
        Py_DECREF(value);
        return -1;
    }
    PyObject *entry = Py_BuildValue("(OiLLNNL)", r->topic, (int)r->partition,
                                    (long long)r->first, (long long)r->last, headers, value,
                                    (long long)r->ts);
    if (entry == NULL)
        return -1;
    int rc = PyList_Append(r->out, entry);
    Py_DECREF(entry);
    return rc;
}

static int same_topic(PyObject *a, PyObject *b) {
    if (a == b)
        return 1;
    int eq = PyObject_RichCompareBool(a, b, Py_EQ);
    if (eq < 0)
        PyErr_Clear();
    return eq == 1;
}

/* Add one record: it extends the open run if it is the next offset of the run's
 * partition and of the run's kind, PLAIN, or DELAYED or TXN with byte-equal headers
 * (DELAYED: and the run's timestamp).
 * `hs` is swapped into the run when the record starts one, so the caller
 * passes the spare buffer next time: headers point into records alive for the call. */
static int runs_add(runs_t *r, PyObject *topic, int32_t partition, int64_t offset, int64_t ts,
                    hdrs_t *hs, const void *payload, size_t len) {
    int marker;
    enum kind kind = classify(hs, &marker);
    if (r->open && kind != SINGLE && kind == r->kind && partition == r->partition &&
        offset == r->last + 1 && same_topic(topic, r->topic) &&
        (kind == PLAIN || hdrs_equal(hs, &r->hdrs)) && (kind != DELAYED || ts == r->ts)) {
        r->last = offset;
        return 0;
    }
    if (runs_flush(r) < 0)
        return -1;
    r->open = 1;
    r->kind = kind;
    r->topic = topic;
    r->partition = partition;
    r->first = r->last = offset;
    r->ts = ts;
    hdrs_t spare = r->hdrs;
    r->hdrs = *hs;
    *hs = spare;
    hs->n = 0;
    if (marker && payload != NULL) {
        r->value = PyBytes_FromStringAndSize(payload, (Py_ssize_t)len);
        if (r->value == NULL)
            return -1;
    }
    return 0;
}

static void runs_free(runs_t *r, hdrs_t *spare) {
    Py_CLEAR(r->value);
    PyMem_Free(r->hdrs.h);
    PyMem_Free(spare->h);
}

/* ---- coalesce(records): the rules on records given from Python ---- */
static int bytes_or_none(PyObject *o, const char *what, const void **p, size_t *n) {
    *p = NULL;
    *n = 0;
    if (o == Py_None)
        return 0;
    if (!PyBytes_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s is bytes or None, not %s", what, Py_TYPE(o)->tp_name);
        return -1;
    }
    *p = PyBytes_AS_STRING(o);
    *n = (size_t)PyBytes_GET_SIZE(o);
    return 0;
}

static PyObject *coalesce(PyObject *self, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "coalesce() takes a sequence of records");
    if (seq == NULL)
        return NULL;
    runs_t r = {0};
    hdrs_t hs = {0};
    r.out = PyList_New(0);
    if (r.out == NULL)
        goto fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *topic, *headers, *value;
        int partition;
        long long offset, ts;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "UiLOOL;a record is "
                              "(topic, partition, offset, headers, value, timestamp)",
                              &topic, &partition, &offset, &headers, &value, &ts))
            goto fail;
        hs.n = 0;
        if (headers != Py_None) {
            if (!PyList_Check(headers)) {
                PyErr_SetString(PyExc_TypeError, "a record's headers are a list or None");
                goto fail;
            }
            for (Py_ssize_t j = 0; j < PyList_GET_SIZE(headers); j++) {
                PyObject *name, *hv;
                if (!PyArg_ParseTuple(PyList_GET_ITEM(headers, j), "UO;a header is (name, "
                                      "value)", &name, &hv))
                    goto fail;
                Py_ssize_t nlen;
                const char *cname = PyUnicode_AsUTF8AndSize(name, &nlen);
                if (cname == NULL)
                    goto fail;
                const void *v;
                size_t size;
                if (bytes_or_none(hv, "a header's value", &v, &size) < 0 ||
                    hdrs_push(&hs, cname, nlen, v, size) < 0)
                    goto fail;
            }
        }
        const void *payload;
        size_t len;
        if (bytes_or_none(value, "a record's value", &payload, &len) < 0)
            goto fail;
        if (runs_add(&r, topic, partition, offset, ts, &hs, payload, len) < 0)
            goto fail;
    }
    if (runs_flush(&r) < 0)
        goto fail;
    runs_free(&r, &hs);
    Py_DECREF(seq);
    return r.out;
fail:
    runs_free(&r, &hs);
    Py_XDECREF(r.out);
    Py_DECREF(seq);
    return NULL;
}

/* ---- load(path, consumer_type): librdkafka's symbols ---- */
static PyObject *load(PyObject *self, PyObject *args) {
    const char *path;
    PyObject *ctype;
    if (!PyArg_ParseTuple(args, "sO!", &path, &PyType_Type, &ctype))
        return NULL;
    if (rk_lib != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "librdkafka is loaded already");
        return NULL;
    }
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        PyErr_Format(PyExc_ImportError, "cannot open librdkafka at %s: %s", path, dlerror());
        return NULL;
    }
#define SYM(field, symbol)                                                                 \
    do {                                                                                   \
        *(void **)(&rk.field) = dlsym(lib, symbol);                                        \
        if (rk.field == NULL) {                                                            \
            PyErr_Format(PyExc_ImportError, "librdkafka at %s has no %s", path, symbol);  \
            dlclose(lib);                                                                  \
            memset(&rk, 0, sizeof rk);                                                     \
            return NULL;                                                                   \
        }                                                                                  \
    } while (0)
    SYM(version, "rd_kafka_version");
    SYM(type, "rd_kafka_type");
    SYM(name, "rd_kafka_name");
    SYM(queue_new, "rd_kafka_queue_new");
    SYM(queue_destroy, "rd_kafka_queue_destroy");
    SYM(queue_get_partition, "rd_kafka_queue_get_partition");
    SYM(queue_forward, "rd_kafka_queue_forward");
    SYM(queue_get_consumer, "rd_kafka_queue_get_consumer");
    SYM(queue_poll, "rd_kafka_queue_poll");
    SYM(queue_io_event_enable, "rd_kafka_queue_io_event_enable");
    SYM(event_type, "rd_kafka_event_type");
    SYM(event_message_next, "rd_kafka_event_message_next");
    SYM(event_error, "rd_kafka_event_error");
    SYM(event_error_string, "rd_kafka_event_error_string");
    SYM(event_destroy, "rd_kafka_event_destroy");
    SYM(event_topic_partition, "rd_kafka_event_topic_partition");
    SYM(topic_partition_destroy, "rd_kafka_topic_partition_destroy");
    SYM(topic_name, "rd_kafka_topic_name");
    SYM(message_timestamp, "rd_kafka_message_timestamp");
    SYM(message_headers, "rd_kafka_message_headers");
    SYM(header_get_all, "rd_kafka_header_get_all");
    SYM(err2str, "rd_kafka_err2str");
    SYM(AdminOptions_new, "rd_kafka_AdminOptions_new");
    SYM(AdminOptions_set_request_timeout, "rd_kafka_AdminOptions_set_request_timeout");
    SYM(AdminOptions_destroy, "rd_kafka_AdminOptions_destroy");
    SYM(TopicCollection_of_topic_names, "rd_kafka_TopicCollection_of_topic_names");
    SYM(TopicCollection_destroy, "rd_kafka_TopicCollection_destroy");
    SYM(DescribeTopics, "rd_kafka_DescribeTopics");
    SYM(event_DescribeTopics_result, "rd_kafka_event_DescribeTopics_result");
    SYM(DescribeTopics_result_topics, "rd_kafka_DescribeTopics_result_topics");
    SYM(TopicDescription_name, "rd_kafka_TopicDescription_name");
    SYM(TopicDescription_topic_id, "rd_kafka_TopicDescription_topic_id");
    SYM(TopicDescription_error, "rd_kafka_TopicDescription_error");
    SYM(error_code, "rd_kafka_error_code");
    SYM(Uuid_base64str, "rd_kafka_Uuid_base64str");
#undef SYM
    rk_lib = lib;
    consumer_type = (PyTypeObject *)Py_NewRef(ctype);
    return PyLong_FromLong(rk.version());
}

/* ---- Scan ---- */
typedef struct {
    PyObject_HEAD
    void *rk;
} HandleHead; /* confluent-kafka's Handle begins so */

typedef struct {
    PyObject_HEAD
    PyObject *consumer;
    rd_kafka_queue_t *q;
} Scan;

static rd_kafka_t *scan_rk(Scan *s) {
    rd_kafka_t *h = s->consumer ? ((HandleHead *)s->consumer)->rk : NULL;
    if (h == NULL || s->q == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the scan or its consumer is closed");
        return NULL;
    }
    return h;
}

/* The rd_kafka_t of a confluent_kafka.Consumer, checked: its type, and librdkafka's
 * name of it starting with prefix (the client.id given; "" takes any name). */
static rd_kafka_t *consumer_handle(PyObject *consumer, const char *prefix) {
    if (rk_lib == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "load() librdkafka first");
        return NULL;
    }
    if (!PyObject_TypeCheck(consumer, consumer_type)) {
        PyErr_Format(PyExc_TypeError, "expected a %s, not a %s", consumer_type->tp_name,
                     Py_TYPE(consumer)->tp_name);
        return NULL;
    }
    rd_kafka_t *h = ((HandleHead *)consumer)->rk;
    if (h == NULL) {
        PyErr_SetString(PyExc_ValueError, "the consumer is closed");
        return NULL;
    }
    const char *name = rk.name(h);
    if (rk.type(h) != RD_KAFKA_CONSUMER || name == NULL ||
        strncmp(name, prefix, strlen(prefix)) != 0) {
        PyErr_Format(PyExc_TypeError, "not the handle of consumer %s: its layout is not the "
                     "one this module knows", prefix);
        return NULL;
    }
    return h;
}

static int Scan_init(Scan *s, PyObject *args, PyObject *kw) {
    PyObject *consumer;
    const char *prefix;
    if (!PyArg_ParseTuple(args, "Os", &consumer, &prefix))
        return -1;
    rd_kafka_t *h = consumer_handle(consumer, prefix);
    if (h == NULL)
        return -1;
    s->q = rk.queue_new(h);
    if (s->q == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "librdkafka made no queue");
        return -1;
    }
    Py_XSETREF(s->consumer, Py_NewRef(consumer));
    return 0;
}

/* Forward a partition's fetch queue to this scan's queue (attach), or back to the
 * consumer's own queue, where confluent-kafka's poll reads it (detach). */
static PyObject *forward_partition(Scan *s, PyObject *args, int to_scan) {
    const char *topic;
    int partition;
    if (!PyArg_ParseTuple(args, "si", &topic, &partition))
        return NULL;
    rd_kafka_t *h = scan_rk(s);
    if (h == NULL)
        return NULL;
    rd_kafka_queue_t *pq = rk.queue_get_partition(h, topic, partition);
    rd_kafka_queue_t *to = to_scan ? s->q : rk.queue_get_consumer(h);
    if (pq != NULL && to != NULL)
        rk.queue_forward(pq, to);
    if (pq != NULL)
        rk.queue_destroy(pq);
    if (!to_scan && to != NULL)
        rk.queue_destroy(to);
    if (pq == NULL || to == NULL) {
        PyErr_Format(PyExc_ValueError, "librdkafka has no queue for %s-%d", topic, partition);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Scan_attach(Scan *s, PyObject *args) { return forward_partition(s, args, 1); }

static PyObject *Scan_detach(Scan *s, PyObject *args) { return forward_partition(s, args, 0); }

static PyObject *topic_of(const rd_kafka_message_t *m, PyObject *cache) {
    PyObject *key = PyLong_FromVoidPtr(m->rkt);
    if (key == NULL)
        return NULL;
    PyObject *topic = PyDict_GetItemWithError(cache, key); /* borrowed */
    if (topic == NULL && !PyErr_Occurred()) {
        topic = PyUnicode_FromString(rk.topic_name(m->rkt));
        if (topic != NULL) {
            int rc = PyDict_SetItem(cache, key, topic);
            Py_DECREF(topic); /* the cache holds it */
            if (rc < 0)
                topic = NULL;
        }
    }
    Py_DECREF(key);
    return topic;
}

static int add_error(PyObject *errors, PyObject *topic, int32_t partition, int code,
                     const char *why, Py_ssize_t wlen) {
    PyObject *text = PyUnicode_DecodeUTF8(why, wlen, "replace");
    if (text == NULL)
        return -1;
    PyObject *e = Py_BuildValue("(OiiN)", topic, (int)partition, code, text);
    if (e == NULL)
        return -1;
    int rc = PyList_Append(errors, e);
    Py_DECREF(e);
    return rc;
}

/* Up to max events off q into evs, waiting up to timeout_ms for the first (GIL released). */
static Py_ssize_t poll_events(rd_kafka_queue_t *q, rd_kafka_event_t **evs, Py_ssize_t max,
                              int timeout_ms) {
    Py_ssize_t n = 0;
    Py_BEGIN_ALLOW_THREADS
    rd_kafka_event_t *ev = rk.queue_poll(q, timeout_ms);
    while (ev != NULL) {
        evs[n++] = ev;
        if (n == max)
            break;
        ev = rk.queue_poll(q, 0);
    }
    Py_END_ALLOW_THREADS
    return n;
}

/* Events, not rd_kafka_consume_batch_queue(): serving a queue that way runs the
 * callbacks confluent-kafka set on the handle (its log and error callbacks expect the
 * GIL state of its own calls, and abort the process without it). rd_kafka_queue_poll()
 * returns every op that has an event type as an event and runs no callback. */
static PyObject *Scan_scan(Scan *s, PyObject *args) {
    Py_ssize_t max;
    int timeout_ms;
    if (!PyArg_ParseTuple(args, "ni", &max, &timeout_ms))
        return NULL;
    if (max < 1) {
        PyErr_SetString(PyExc_ValueError, "max must be at least 1");
        return NULL;
    }
    if (scan_rk(s) == NULL)
        return NULL;
    rd_kafka_event_t **evs = PyMem_Malloc((size_t)max * sizeof *evs);
    if (evs == NULL)
        return PyErr_NoMemory();
    Py_ssize_t n = poll_events(s->q, evs, max, timeout_ms);
    PyObject *result = NULL, *errors = PyList_New(0), *topics = PyDict_New();
    runs_t r = {0};
    hdrs_t hs = {0};
    r.out = PyList_New(0);
    if (errors == NULL || topics == NULL || r.out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        int type = rk.event_type(evs[i]);
        if (type == RD_KAFKA_EVENT_ERROR) {
            const char *why = rk.event_error_string(evs[i]);
            if (add_error(errors, Py_None, -1, rk.event_error(evs[i]), why ? why : "",
                          why ? (Py_ssize_t)strlen(why) : 0) < 0)
                goto done;
            continue;
        }
        if (type != RD_KAFKA_EVENT_FETCH)
            continue;
        const rd_kafka_message_t *m;
        while ((m = rk.event_message_next(evs[i])) != NULL) {
            PyObject *topic = m->rkt ? topic_of(m, topics) : Py_None;
            if (topic == NULL)
                goto done;
            if (m->err) {
                const char *why = m->payload ? (const char *)m->payload : rk.err2str(m->err);
                if (add_error(errors, topic, m->partition, m->err, why,
                              m->payload ? (Py_ssize_t)m->len : (Py_ssize_t)strlen(why)) < 0)
                    goto done;
                continue;
            }
            hs.n = 0;
            rd_kafka_headers_t *rh = NULL;
            if (rk.message_headers(m, &rh) == 0 && rh != NULL) {
                const char *name;
                const void *v;
                size_t size;
                for (size_t j = 0; rk.header_get_all(rh, j, &name, &v, &size) == 0; j++)
                    if (hdrs_push(&hs, name, (Py_ssize_t)strlen(name), v, size) < 0)
                        goto done;
            }
            int tstype;
            int64_t ts = rk.message_timestamp(m, &tstype);
            if (runs_add(&r, topic, m->partition, m->offset, ts, &hs, m->payload, m->len) < 0)
                goto done;
        }
    }
    if (runs_flush(&r) < 0)
        goto done;
    result = PyTuple_Pack(2, r.out, errors);
done:
    runs_free(&r, &hs);
    Py_XDECREF(r.out);
    Py_XDECREF(errors);
    Py_XDECREF(topics); /* entries hold their topics */
    for (Py_ssize_t i = 0; i < n; i++)
        rk.event_destroy(evs[i]); /* and their messages: after the last header is read */
    PyMem_Free(evs);
    return result;
}

/* Give a queue reference back (io events off first if they were on), and the consumer. */
static void release_queue(PyObject **consumer, rd_kafka_queue_t **q, int io_events) {
    if (*q != NULL) {
        /* After the consumer's close its handle is gone, and the queue with it. */
        if (*consumer != NULL && ((HandleHead *)*consumer)->rk != NULL) {
            if (io_events)
                rk.queue_io_event_enable(*q, -1, NULL, 0);
            rk.queue_destroy(*q);
        }
        *q = NULL;
    }
    Py_CLEAR(*consumer);
}

static PyObject *Scan_close(Scan *s, PyObject *ignored) {
    release_queue(&s->consumer, &s->q, 0);
    Py_RETURN_NONE;
}

static void Scan_dealloc(Scan *s) {
    Py_XDECREF(Scan_close(s, NULL));
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* ---- take(): the Spark source task's committed-only filter over the scan's queue ---- */
/* Scan.take(max, timeout_ms, end, pos, skip, spans, names, plain, cols, one)
 *   -> (seen, pos, ended)
 * The rule of txnstream_spark.take (its docstring says it) applied to librdkafka's
 * messages as they come off this scan's queue, with no confluent-kafka Message made:
 * up to max messages are taken (waiting up to timeout_ms for the first), in order. A
 * deliverable record of the common shapes (no headers; txn.id, or txn.id then txn.tag)
 * is appended to cols (keys, values, offsets, timestamps, timestamp types, headers,
 * txn ids); a skipped one moves pos past it; any other record (an error, user headers,
 * a marker, a txn.id not in names or not bytes-shaped, a txn record in a range planned
 * plain) is handed, in its turn, to one((offset, key, value, headers, timestamp type,
 * timestamp, error code, error text)) - the task's full rule - which appends it or not
 * and returns the position past it, -1 (an error) or None (at or past the end). Records
 * at or past end end the take (ended; pos is end) and those after them are dropped, as
 * does librdkafka's end-of-partition event (enable.partition.eof) at or past end: the
 * offsets below it that came as no message were control records (a Kafka txn's marker).
 * seen counts the messages and errors taken off the queue. */
static PyObject *no_headers; /* defined with take_rows, below */

static int header_is(const char *name, const char *want) { return strcmp(name, want) == 0; }

static PyObject *bytes_or_none_of(const void *p, size_t n) {
    return p ? PyBytes_FromStringAndSize(p, (Py_ssize_t)n) : Py_NewRef(Py_None);
}

/* The record as one() sees it: (offset, key, value, headers, tstype, ts, err, why). */
static PyObject *odd_record(const rd_kafka_message_t *m, int err, const char *why,
                            Py_ssize_t wlen) {
    PyObject *headers = Py_NewRef(Py_None), *key = NULL, *value = NULL, *text = NULL;
    long long ts = -1;
    int tstype = 0;
    if (m != NULL && !err) {
        rd_kafka_headers_t *rh = NULL;
        if (rk.message_headers(m, &rh) == 0 && rh != NULL) {
            hdrs_t hs = {0};
            const char *name;
            const void *v;
            size_t size;
            for (size_t j = 0; rk.header_get_all(rh, j, &name, &v, &size) == 0; j++)
                if (hdrs_push(&hs, name, (Py_ssize_t)strlen(name), v, size) < 0) {
                    PyMem_Free(hs.h);
                    Py_DECREF(headers);
                    return NULL;
                }
            Py_SETREF(headers, headers_list(&hs));
            PyMem_Free(hs.h);
            if (headers == NULL)
                return NULL;
        }
        ts = rk.message_timestamp(m, &tstype);
    }
    key = m && !err ? bytes_or_none_of(m->key, m->key_len) : Py_NewRef(Py_None);
    value = m && !err ? bytes_or_none_of(m->payload, m->len) : Py_NewRef(Py_None);
    text = why ? PyUnicode_DecodeUTF8(why, wlen, "replace") : Py_NewRef(Py_None);
    if (key == NULL || value == NULL || text == NULL) {
        Py_XDECREF(key);
        Py_XDECREF(value);
        Py_XDECREF(text);
        Py_DECREF(headers);
        return NULL;
    }
    return Py_BuildValue("(LNNNiLiN)", m ? (long long)m->offset : -1LL, key, value, headers,
                         tstype, ts, err, text);
}

typedef struct {
    PyObject *raw;    /* the last txn.id looked up (new reference), or NULL */
    PyObject *txn;    /* its name (borrowed from names, which never drops one), or NULL */
    long long lo, hi; /* its aborted span's offsets (lo > hi: no span) */
} last_txn_t;

/* Look up a txn.id's value: 1 found (its name in *txn, lo/hi its span), 0 not named yet,
 * -1 error. The last one found is kept: a txn's records come in runs. */
static int lookup_txn(last_txn_t *last, const void *v, size_t size, PyObject *spans,
                      PyObject *names) {
    if (last->raw != NULL && (size_t)PyBytes_GET_SIZE(last->raw) == size &&
        memcmp(PyBytes_AS_STRING(last->raw), v, size) == 0)
        return 1;
    PyObject *raw = PyBytes_FromStringAndSize(v, (Py_ssize_t)size);
    if (raw == NULL)
        return -1;
    long long lo = 1, hi = 0;
    if (spans != NULL) {
        PyObject *span = PyDict_GetItemWithError(spans, raw);
        if (span == NULL && PyErr_Occurred())
            goto fail;
        if (span != NULL && !PyArg_ParseTuple(span, "LL", &lo, &hi))
            goto fail;
    }
    PyObject *txn = PyDict_GetItemWithError(names, raw);
    if (txn == NULL) {
        if (PyErr_Occurred())
            goto fail;
        Py_DECREF(raw);
        return 0;
    }
    Py_XSETREF(last->raw, raw);
    last->txn = txn;
    last->lo = lo;
    last->hi = hi;
    return 1;
fail:
    Py_DECREF(raw);
    return -1;
}

static int append_row(PyObject **col, const rd_kafka_message_t *m, PyObject *txn) {
    int tstype;
    long long ts = rk.message_timestamp(m, &tstype);
    PyObject *v[5] = {bytes_or_none_of(m->key, m->key_len),
                      bytes_or_none_of(m->payload, m->len), PyLong_FromLongLong(m->offset),
                      PyLong_FromLongLong(ts), PyLong_FromLong(tstype)};
    int ok = 1;
    for (int c = 0; c < 5; c++)
        ok = ok && v[c] != NULL && PyList_Append(col[c], v[c]) == 0;
    ok = ok && PyList_Append(col[5], no_headers) == 0 && PyList_Append(col[6], txn) == 0;
    for (int c = 0; c < 5; c++)
        Py_XDECREF(v[c]);
    return ok ? 0 : -1;
}

/* one(record) for a record the fast rule leaves: 1 go on, 0 ended, -1 error. */
static int call_one(PyObject *one, PyObject *rec, long long *pos, long long end) {
    if (rec == NULL)
        return -1;
    PyObject *r = PyObject_CallOneArg(one, rec);
    Py_DECREF(rec);
    if (r == NULL)
        return -1;
    if (r == Py_None) {
        Py_DECREF(r);
        *pos = end;
        return 0;
    }
    long long at = PyLong_AsLongLong(r);
    Py_DECREF(r);
    if (at == -1 && PyErr_Occurred())
        return -1;
    if (at > *pos)
        *pos = at;
    return 1;
}

static PyObject *Scan_take(Scan *s, PyObject *args) {
    Py_ssize_t max;
    int timeout_ms, plain;
    long long end, pos;
    PyObject *skip, *spans, *names, *cols, *one;
    if (!PyArg_ParseTuple(args, "niLLOOO!pO!O", &max, &timeout_ms, &end, &pos, &skip, &spans,
                          &PyDict_Type, &names, &plain, &PyTuple_Type, &cols, &one))
        return NULL;
    PyObject *col[7];
    if (PyTuple_GET_SIZE(cols) != 7) {
        PyErr_SetString(PyExc_ValueError, "cols: 7 lists");
        return NULL;
    }
    for (int c = 0; c < 7; c++)
        if (!PyList_Check(col[c] = PyTuple_GET_ITEM(cols, c))) {
            PyErr_SetString(PyExc_TypeError, "cols: 7 lists");
            return NULL;
        }
    if (max < 1 || !PyAnySet_Check(skip) || (spans != Py_None && !PyDict_Check(spans)) ||
        !PyCallable_Check(one)) {
        PyErr_SetString(PyExc_TypeError, "take: max >= 1, skip a set, spans a dict or None, "
                                         "one a callable");
        return NULL;
    }
    if (scan_rk(s) == NULL)
        return NULL;
    PyObject *span_dict = spans != Py_None && PyDict_GET_SIZE(spans) > 0 ? spans : NULL;
    int has_skip = PySet_GET_SIZE(skip) > 0;
    rd_kafka_event_t **evs = PyMem_Malloc((size_t)max * sizeof *evs);
    if (evs == NULL)
        return PyErr_NoMemory();
    Py_ssize_t n = poll_events(s->q, evs, max, timeout_ms), seen = 0;
    int ended = 0, failed = 0;
    last_txn_t last = {NULL, NULL, 1, 0};
    for (Py_ssize_t i = 0; i < n && !ended && !failed; i++) {
        int type = rk.event_type(evs[i]);
        if (type == RD_KAFKA_EVENT_ERROR) {
            seen++;
            const char *why = rk.event_error_string(evs[i]);
            int code = rk.event_error(evs[i]);
            if (code == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
                rd_kafka_topic_partition_t *at = rk.event_topic_partition(evs[i]);
                long long eof = at ? (long long)at->offset : -1;
                if (at)
                    rk.topic_partition_destroy(at);
                if (eof >= end) { /* read to its end: what is left below it were */
                    pos = end;    /* control records (a Kafka txn's markers) */
                    ended = 1;
                }
                continue;
            }
            int rc = call_one(one, odd_record(NULL, code ? code : -1, why ? why : "",
                                              why ? (Py_ssize_t)strlen(why) : 0), &pos, end);
            failed = rc < 0;
            ended = rc == 0;
            continue;
        }
        if (type != RD_KAFKA_EVENT_FETCH)
            continue;
        const rd_kafka_message_t *m;
        while (!ended && !failed && (m = rk.event_message_next(evs[i])) != NULL) {
            seen++;
            if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
                if (m->offset >= end) { /* as above, if it comes as a message */
                    pos = end;
                    ended = 1;
                    break;
                }
                continue;
            }
            if (m->err) {
                const char *why = m->payload ? (const char *)m->payload : rk.err2str(m->err);
                int rc = call_one(one, odd_record(m, m->err, why, m->payload ? (Py_ssize_t)m->len
                                                  : (Py_ssize_t)strlen(why)), &pos, end);
                failed = rc < 0;
                ended = rc == 0;
                continue;
            }
            long long off = m->offset;
            if (off >= end) {
                pos = end;
                ended = 1;
                break;
            }
            if (has_skip) {
                PyObject *o = PyLong_FromLongLong(off);
                int skipped = o ? PySet_Contains(skip, o) : -1;
                Py_XDECREF(o);
                if (skipped < 0) {
                    failed = 1;
                    break;
                }
                if (skipped) {
                    pos = off + 1;
                    continue;
                }
            }
            rd_kafka_headers_t *rh = NULL;
            const char *n0 = NULL, *n1 = NULL, *name;
            const void *v0 = NULL, *v;
            size_t s0 = 0, size, nh = 0;
            if (rk.message_headers(m, &rh) == 0 && rh != NULL)
                for (; rk.header_get_all(rh, nh, &name, &v, &size) == 0; nh++) {
                    if (nh == 0) {
                        n0 = name;
                        v0 = v;
                        s0 = size;
                    } else if (nh == 1) {
                        n1 = name;
                    }
                }
            PyObject *txn = Py_None;
            int leave = 0, drop = 0;
            if (nh > 0) {
                if (plain || nh > 2 || v0 == NULL || !header_is(n0, "txn.id") ||
                    (nh == 2 && !header_is(n1, "txn.tag"))) {
                    leave = 1; /* user headers, a marker, a plain range's txn record */
                } else {
                    int found = lookup_txn(&last, v0, s0, span_dict, names);
                    if (found < 0) {
                        failed = 1;
                        break;
                    }
                    if (!found) {
                        leave = 1; /* its name is made in Python, once */
                    } else if (last.lo <= off && off <= last.hi) {
                        drop = 1; /* a record of an aborted txn */
                    } else if (last.txn == Py_None) {
                        drop = 1; /* an undecodable txn.id is never delivered */
                    } else {
                        txn = last.txn;
                    }
                }
            }
            if (leave) {
                int rc = call_one(one, odd_record(m, 0, NULL, 0), &pos, end);
                failed = rc < 0;
                ended = rc == 0;
                continue;
            }
            pos = off + 1;
            if (!drop && append_row(col, m, txn) < 0)
                failed = 1;
        }
    }
    Py_XDECREF(last.raw);
    for (Py_ssize_t i = 0; i < n; i++)
        rk.event_destroy(evs[i]);
    PyMem_Free(evs);
    if (failed)
        return NULL;
    return Py_BuildValue("(nLO)", seen, pos, ended ? Py_True : Py_False);
}

static PyMethodDef Scan_methods[] = {
    {"attach", (PyCFunction)Scan_attach, METH_VARARGS,
     "attach(topic, partition): forward the partition's fetch queue to this scan's"},
    {"detach", (PyCFunction)Scan_detach, METH_VARARGS,
     "detach(topic, partition): forward the partition's fetch queue to the consumer's again"},
    {"scan", (PyCFunction)Scan_scan, METH_VARARGS,
     "scan(max, timeout_ms) -> (entries, errors): up to max records, as entries"},
    {"take", (PyCFunction)Scan_take, METH_VARARGS,
     "take(max, timeout_ms, end, pos, skip, spans, names, plain, cols, one) -> (seen, pos, "
     "ended): the Spark source task's filter over this queue (txnstream_spark.take)"},
    {"close", (PyCFunction)Scan_close, METH_NOARGS,
     "close(): destroy the queue (before the consumer's close)"},
    {NULL}};

static PyTypeObject ScanType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "txnstream._native.Scan",
    .tp_basicsize = sizeof(Scan),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The records of a confluent_kafka.Consumer's attached partitions, as entries.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Scan_init,
    .tp_dealloc = (destructor)Scan_dealloc,
    .tp_methods = Scan_methods,
};

/* ---- Wake: a file descriptor written when a consumer's queue gets something ---- */
/* librdkafka writes one byte to the fd when an op (a fetched batch, an error, a
 * rebalance) is enqueued on the consumer's queue and the queue was read since its last
 * byte (rd_kafka_queue_io_event_enable). A reader that polls two consumers (the
 * committed-only consumer's data and its follower's state) waits on both fds at once
 * instead of on one consumer's poll while the other's news waits (txnstream/kafka/wake.py).
 * The queue reference is destroyed by close(), before the consumer is closed. */
typedef struct {
    PyObject_HEAD
    PyObject *consumer;
    rd_kafka_queue_t *q;
} Wake;

static int Wake_init(Wake *w, PyObject *args, PyObject *kw) {
    PyObject *consumer;
    const char *prefix;
    int fd;
    if (!PyArg_ParseTuple(args, "Osi", &consumer, &prefix, &fd))
        return -1;
    if (w->q != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "this wake watches a queue already");
        return -1;
    }
    if (fd < 0) {
        PyErr_SetString(PyExc_ValueError, "fd must be an open file descriptor");
        return -1;
    }
    rd_kafka_t *h = consumer_handle(consumer, prefix);
    if (h == NULL)
        return -1;
    w->q = rk.queue_get_consumer(h);
    if (w->q == NULL) {
        PyErr_SetString(PyExc_ValueError, "the consumer has no consumer queue (no group.id)");
        return -1;
    }
    rk.queue_io_event_enable(w->q, fd, "w", 1);
    Py_XSETREF(w->consumer, Py_NewRef(consumer));
    return 0;
}

static PyObject *Wake_close(Wake *w, PyObject *ignored) {
    release_queue(&w->consumer, &w->q, 1);
    Py_RETURN_NONE;
}

static void Wake_dealloc(Wake *w) {
    Py_XDECREF(Wake_close(w, NULL));
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static PyMethodDef Wake_methods[] = {
    {"close", (PyCFunction)Wake_close, METH_NOARGS,
     "close(): stop writing to the fd and release the queue (before the consumer's close)"},
    {NULL}};

static PyTypeObject WakeType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "txnstream._native.Wake",
    .tp_basicsize = sizeof(Wake),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Wake(consumer, client_id_prefix, fd): a byte to fd when the consumer's queue "
              "gets an op.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Wake_init,
    .tp_dealloc = (destructor)Wake_dealloc,
    .tp_methods = Wake_methods,
};

/* Kafka's murmur2 (Java's Utils.murmur2, as txnstream/kafka/partitioning.py transcribes it). */
static uint32_t murmur2(const unsigned char *data, size_t len) {
    const uint32_t m = 0x5bd1e995u;
    uint32_t h = 0x9747b28cu ^ (uint32_t)len;
    size_t words = len & ~(size_t)3;
    for (size_t i = 0; i < words; i += 4) {
        uint32_t k = (uint32_t)data[i] | (uint32_t)data[i + 1] << 8 |
                     (uint32_t)data[i + 2] << 16 | (uint32_t)data[i + 3] << 24;
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    switch (len & 3) {
    case 3:
        h ^= (uint32_t)data[words + 2] << 16; /* fall through */
    case 2:
        h ^= (uint32_t)data[words + 1] << 8; /* fall through */
    case 1:
        h ^= (uint32_t)data[words];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return h;
}

/* murmur2_partitions(keys, n) -> list: each key's partition of n, -1 for None. */
static PyObject *murmur2_partitions(PyObject *self, PyObject *args) {
    PyObject *keys;
    long n;
    if (!PyArg_ParseTuple(args, "Ol", &keys, &n))
        return NULL;
    if (n < 1 || n > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "murmur2_partitions: %ld partitions", n);
        return NULL;
    }
    PyObject *seq = PySequence_Fast(keys, "murmur2_partitions: keys must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyList_New(count);
    if (out == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < count; i++) {
        long part = -1;
        if (items[i] != Py_None) {
            Py_buffer view;
            if (PyObject_GetBuffer(items[i], &view, PyBUF_SIMPLE) < 0) {
                PyErr_Format(PyExc_TypeError, "key %zd is %s: expected bytes or None", i,
                             Py_TYPE(items[i])->tp_name);
                goto fail;
            }
            part = (long)((murmur2(view.buf, (size_t)view.len) & 0x7fffffffu) % (uint32_t)n);
            PyBuffer_Release(&view);
        }
        PyObject *p = PyLong_FromLong(part);
        if (p == NULL)
            goto fail;
        PyList_SET_ITEM(out, i, p);
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

/* ---- the consumer's per-record helpers (txnstream/message.py) ---- */

/* split_headers(headers) -> (txn.id value or None, has txn.marker, user headers, delay):
 * txnstream.message._split_headers' rule, in C. */
static PyObject *split_headers(PyObject *self, PyObject *headers) {
    PyObject *txn_raw = Py_None, *delay = Py_None, *user = PyList_New(0), *out = NULL;
    int marker = 0;
    if (user == NULL)
        return NULL;
    Py_INCREF(txn_raw);
    Py_INCREF(delay);
    if (headers != Py_None) {
        PyObject *seq = PySequence_Fast(headers, "headers must be a sequence of (name, value)");
        if (seq == NULL)
            goto done;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        PyObject **items = PySequence_Fast_ITEMS(seq);
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = items[i], *k, *v;
            if (PyTuple_CheckExact(item) && PyTuple_GET_SIZE(item) == 2) {
                Py_INCREF(item);
            } else {
                PyObject *pair = PySequence_Tuple(item);
                if (pair == NULL) {
                    Py_DECREF(seq);
                    goto done;
                }
                if (PyTuple_GET_SIZE(pair) != 2) {
                    PyErr_Format(PyExc_ValueError, "header %zd has %zd items, not (name, value)",
                                 i, PyTuple_GET_SIZE(pair));
                    Py_DECREF(pair);
                    Py_DECREF(seq);
                    goto done;
                }
                item = pair;
            }
            k = PyTuple_GET_ITEM(item, 0);
            v = PyTuple_GET_ITEM(item, 1);
            int named = PyUnicode_Check(k);
            if (named && PyUnicode_CompareWithASCIIString(k, "txn.id") == 0) {
                Py_INCREF(v);
                Py_SETREF(txn_raw, v);
            } else if (named && PyUnicode_CompareWithASCIIString(k, "txn.marker") == 0) {
                marker = 1;
            } else if (named && PyUnicode_CompareWithASCIIString(k, "txn.tag") == 0) {
                ;
            } else if (named && (PyUnicode_CompareWithASCIIString(k, "txn.deliver.at") == 0 ||
                                 PyUnicode_CompareWithASCIIString(k, "txn.deliver.after") == 0)) {
                Py_INCREF(item);
                Py_SETREF(delay, item);
            } else if (PyList_Append(user, item) < 0) {
                Py_DECREF(item);
                Py_DECREF(seq);
                goto done;
            }
            Py_DECREF(item);
        }
        Py_DECREF(seq);
    }
    out = PyTuple_Pack(4, txn_raw, marker ? Py_True : Py_False, user, delay);
done:
    Py_DECREF(txn_raw);
    Py_DECREF(delay);
    Py_DECREF(user);
    return out;
}

/* Maker(cls, names): a callable that makes an instance of a class with __slots__ (a
 * frozen slotted dataclass: txnstream.message.Message) from one positional value per
 * name, stored in its slots directly: the dataclass's __init__ sets each field through
 * object.__setattr__ (3 µs for Message's nine). */
#define MAX_SLOTS 16
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyTypeObject *cls;
    Py_ssize_t n;
    Py_ssize_t offsets[MAX_SLOTS];
} Maker;

static PyObject *Maker_call(PyObject *self, PyObject *const *args, size_t nargsf,
                            PyObject *kwnames) {
    Maker *mk = (Maker *)self;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if ((kwnames != NULL && PyTuple_GET_SIZE(kwnames)) || n != mk->n) {
        PyErr_Format(PyExc_TypeError, "%s maker takes %zd positional arguments, %zd given",
                     mk->cls->tp_name, mk->n, n);
        return NULL;
    }
    PyObject *obj = mk->cls->tp_alloc(mk->cls, 0);
    if (obj == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_INCREF(args[i]);
        *(PyObject **)((char *)obj + mk->offsets[i]) = args[i];
    }
    return obj;
}

static PyObject *Maker_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *cls, *names;
    if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &cls, &PyTuple_Type, &names))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    PyTypeObject *t = (PyTypeObject *)cls;
    if (n > MAX_SLOTS || t->tp_itemsize != 0 || t->tp_alloc == NULL) {
        PyErr_Format(PyExc_TypeError, "Maker: %s cannot be made here", t->tp_name);
        return NULL;
    }
    Maker *mk = (Maker *)type->tp_alloc(type, 0);
    if (mk == NULL)
        return NULL;
    mk->vectorcall = Maker_call;
    mk->n = n;
    Py_INCREF(cls);
    mk->cls = t;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PyObject_GetAttr(cls, PyTuple_GET_ITEM(names, i));
        if (d == NULL) {
            Py_DECREF(mk);
            return NULL;
        }
        int ok = Py_IS_TYPE(d, &PyMemberDescr_Type) &&
                 ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX &&
                 PyType_IsSubtype(t, PyDescr_TYPE(d));
        if (ok)
            mk->offsets[i] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "Maker: %R of %s is not a slot",
                         PyTuple_GET_ITEM(names, i), t->tp_name);
            Py_DECREF(mk);
            return NULL;
        }
    }
    return (PyObject *)mk;
}

static void Maker_dealloc(Maker *mk) {
    Py_XDECREF(mk->cls);
    Py_TYPE(mk)->tp_free((PyObject *)mk);
}

static PyTypeObject MakerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "txnstream._native.Maker",
    .tp_basicsize = sizeof(Maker),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Maker(cls, names): makes cls instances from one value per slot name.",
    .tp_new = Maker_new,
    .tp_dealloc = (destructor)Maker_dealloc,
    .tp_vectorcall_offset = offsetof(Maker, vectorcall),
    .tp_call = PyVectorcall_Call,
};


/* take_rows(batch, i, pos, end, skip, spans, names, plain, cols) -> (i, pos, ended): the
 * Spark source task's committed-only filter (txnstream_spark.take._take_rows, its Python
 * twin, says the rule) over confluent-kafka Messages batch[i:], in C. It appends the
 * deliverable records of the common shapes to cols (keys, values, offsets, timestamps,
 * timestamp types, headers, txn ids: lists) and returns at the first record it leaves to
 * Python's full rule (an error, user headers, a marker, a txn.id not in names), with that
 * record's index; ended when a record at or past end was reached (pos is then end). The
 * Messages' methods are called by name, so a test's stand-ins work too. */
static PyObject *call0(PyObject *obj, PyObject *name) {
    PyObject *args[1] = {obj};
    return PyObject_VectorcallMethod(name, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

static PyObject *s_error, *s_offset, *s_headers, *s_key, *s_value, *s_timestamp;
/* The headers column's value of every row taken here: one empty list, never changed (a
 * new one per row made the cyclic GC walk them all: 1.45 against 0.45 µs a record). */
static PyObject *no_headers;

static int is_header(PyObject *pair, const char *name) {
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2)
        return -1;
    PyObject *k = PyTuple_GET_ITEM(pair, 0);
    if (!PyUnicode_Check(k))
        return -1;
    return PyUnicode_CompareWithASCIIString(k, name) == 0;
}

static PyObject *take_rows(PyObject *self, PyObject *args) {
    PyObject *batch, *skip, *spans, *names, *cols;
    Py_ssize_t i;
    long long pos, end;
    int plain;
    if (!PyArg_ParseTuple(args, "O!nLLOOO!pO!", &PyList_Type, &batch, &i, &pos, &end, &skip,
                          &spans, &PyDict_Type, &names, &plain, &PyTuple_Type, &cols))
        return NULL;
    if (PyTuple_GET_SIZE(cols) != 7) {
        PyErr_SetString(PyExc_ValueError, "cols: 7 lists");
        return NULL;
    }
    PyObject *col[7];
    for (int c = 0; c < 7; c++) {
        col[c] = PyTuple_GET_ITEM(cols, c);
        if (!PyList_Check(col[c])) {
            PyErr_SetString(PyExc_TypeError, "cols: 7 lists");
            return NULL;
        }
    }
    if (!PyAnySet_Check(skip) || (spans != Py_None && !PyDict_Check(spans))) {
        PyErr_SetString(PyExc_TypeError, "skip: a set; spans: a dict or None");
        return NULL;
    }
    int has_spans = spans != Py_None && PyDict_GET_SIZE(spans) > 0;
    Py_ssize_t n = PyList_GET_SIZE(batch);
    int ended = 0;
    for (; i < n; i++) {
        PyObject *m = PyList_GET_ITEM(batch, i);
        PyObject *err = call0(m, s_error);
        if (err == NULL)
            return NULL;
        int bad = err != Py_None;
        Py_DECREF(err);
        if (bad)
            break; /* Python logs it (message_error) */
        PyObject *o = call0(m, s_offset);
        if (o == NULL)
            return NULL;
        long long off = PyLong_AsLongLong(o);
        if (off == -1 && PyErr_Occurred()) {
            Py_DECREF(o);
            return NULL;
        }
        if (off >= end) {
            Py_DECREF(o);
            pos = end;
            ended = 1;
            break;
        }
        int skipped = PySet_Contains(skip, o);
        if (skipped < 0) {
            Py_DECREF(o);
            return NULL;
        }
        if (skipped) {
            Py_DECREF(o);
            pos = off + 1;
            continue;
        }
        PyObject *h = call0(m, s_headers);
        if (h == NULL) {
            Py_DECREF(o);
            return NULL;
        }
        PyObject *txn = Py_None; /* borrowed */
        int leave = 0, drop = 0;
        Py_ssize_t nh = h == Py_None ? 0 : (PyList_Check(h) ? PyList_GET_SIZE(h) : -1);
        if (nh < 0) {
            leave = 1; /* not a list: Python's rule */
        } else if (nh > 0) {
            int first = is_header(PyList_GET_ITEM(h, 0), "txn.id");
            int second = nh == 2 ? is_header(PyList_GET_ITEM(h, 1), "txn.tag") : 1;
            if (first != 1 || second != 1 || nh > 2) {
                leave = 1; /* user headers, a marker, a plain range's txn record */
            } else {
                PyObject *raw = PyTuple_GET_ITEM(PyList_GET_ITEM(h, 0), 1);
                if (has_spans) {
                    PyObject *span = PyDict_GetItemWithError(spans, raw);
                    if (span == NULL && PyErr_Occurred()) {
                        Py_DECREF(h);
                        Py_DECREF(o);
                        return NULL;
                    }
                    if (span != NULL) {
                        long long lo, hi;
                        if (!PyArg_ParseTuple(span, "LL", &lo, &hi)) {
                            Py_DECREF(h);
                            Py_DECREF(o);
                            return NULL;
                        }
                        drop = lo <= off && off <= hi; /* a record of an aborted txn */
                    }
                }
                if (!drop) {
                    txn = PyDict_GetItemWithError(names, raw);
                    if (txn == NULL) {
                        if (PyErr_Occurred()) {
                            Py_DECREF(h);
                            Py_DECREF(o);
                            return NULL;
                        }
                        leave = 1; /* its name is made in Python, once */
                    } else if (txn == Py_None) {
                        drop = 1; /* an undecodable txn.id is never delivered */
                    }
                }
            }
            if (plain && !leave)
                leave = 1; /* a txn.id in a range planned plain: Python's rule */
        }
        if (leave) {
            Py_DECREF(h);
            Py_DECREF(o);
            break;
        }
        Py_XINCREF(txn);
        Py_DECREF(h);
        pos = off + 1;
        if (drop) {
            Py_XDECREF(txn);
            Py_DECREF(o);
            continue;
        }
        PyObject *key = call0(m, s_key), *value = key ? call0(m, s_value) : NULL;
        PyObject *ts = value ? call0(m, s_timestamp) : NULL;
        int ok = ts != NULL && PyTuple_Check(ts) && PyTuple_GET_SIZE(ts) == 2;
        if (ts != NULL && !ok)
            PyErr_SetString(PyExc_TypeError, "Message.timestamp() is not a (type, ms) pair");
        if (ok)
            ok = PyList_Append(col[0], key) == 0 && PyList_Append(col[1], value) == 0 &&
                 PyList_Append(col[2], o) == 0 &&
                 PyList_Append(col[3], PyTuple_GET_ITEM(ts, 1)) == 0 &&
                 PyList_Append(col[4], PyTuple_GET_ITEM(ts, 0)) == 0 &&
                 PyList_Append(col[5], no_headers) == 0 && PyList_Append(col[6], txn) == 0;
        Py_XDECREF(key);
        Py_XDECREF(value);
        Py_XDECREF(ts);
        Py_XDECREF(txn);
        Py_DECREF(o);
        if (!ok)
            return NULL;
    }
    return Py_BuildValue("(nLO)", i, pos, ended ? Py_True : Py_False);
}

/* ---- topic_ids(consumer, prefix, names, timeout_ms): Kafka's ids of topics ----
 * One DescribeTopics through the consumer's own handle, waited for with the GIL released;
 * only each topic's name and id are read (confluent-kafka's describe_topics builds a
 * Python object per partition, replica and ISR member: 6.2 ms of CPU for a topic of
 * 1,024 partitions). Returns ({name: base64 id}, error text or None): a topic described
 * with an error, or with no id, is left out; a request that failed or did not answer
 * within timeout_ms leaves every topic out, with why. TopicIds.get in
 * txnstream/buffer/recreation.py gives the same answers through confluent-kafka. */
static PyObject *topic_ids(PyObject *self, PyObject *args) {
    PyObject *consumer, *names;
    const char *prefix;
    int timeout_ms;
    if (!PyArg_ParseTuple(args, "OsO!i", &consumer, &prefix, &PyList_Type, &names,
                          &timeout_ms))
        return NULL;
    if (timeout_ms < 0) {
        PyErr_SetString(PyExc_ValueError, "timeout_ms must be >= 0");
        return NULL;
    }
    rd_kafka_t *h = consumer_handle(consumer, prefix);
    if (h == NULL)
        return NULL;
    PyObject *held = PyList_AsTuple(names); /* the texts stay alive until copied */
    if (held == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(held);
    PyObject *out = PyDict_New();
    const char **cn = PyMem_Calloc(n ? n : 1, sizeof(char *));
    if (out == NULL || cn == NULL) {
        Py_DECREF(held);
        Py_XDECREF(out);
        PyMem_Free(cn);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(held, i);
        if (!PyUnicode_Check(name)) {
            PyErr_Format(PyExc_TypeError, "topic names must be str, not %s",
                         Py_TYPE(name)->tp_name);
            goto fail;
        }
        if ((cn[i] = PyUnicode_AsUTF8(name)) == NULL)
            goto fail;
    }
    if (n == 0) {
        Py_DECREF(held);
        PyMem_Free(cn);
        return Py_BuildValue("(NO)", out, Py_None);
    }
    char errstr[256] = "";
    rd_kafka_AdminOptions_t *opts = rk.AdminOptions_new(h, RD_KAFKA_ADMIN_OP_ANY);
    rd_kafka_queue_t *q = rk.queue_new(h);
    rd_kafka_TopicCollection_t *tc = rk.TopicCollection_of_topic_names(cn, (size_t)n);
    Py_CLEAR(held); /* the collection holds copies */
    PyMem_Free(cn);
    cn = NULL;
    const char *why = NULL;
    rd_kafka_event_t *ev = NULL;
    if (opts == NULL || q == NULL || tc == NULL)
        why = "librdkafka made no request";
    else if (rk.AdminOptions_set_request_timeout(opts, timeout_ms, errstr, sizeof errstr))
        why = errstr;
    else {
        rk.DescribeTopics(h, tc, opts, q);
        Py_BEGIN_ALLOW_THREADS
        ev = rk.queue_poll(q, timeout_ms + 1000); /* librdkafka times it out first */
        Py_END_ALLOW_THREADS
        if (ev == NULL)
            why = "no answer in time";
        else if (rk.event_error(ev))
            why = rk.event_error_string(ev);
    }
    int failed = 0;
    if (why == NULL) {
        const rd_kafka_DescribeTopics_result_t *res = rk.event_DescribeTopics_result(ev);
        size_t cnt = 0;
        const rd_kafka_TopicDescription_t **descs =
            res ? rk.DescribeTopics_result_topics(res, &cnt) : NULL;
        if (res == NULL)
            why = "not a DescribeTopics result";
        for (size_t i = 0; descs != NULL && i < cnt && !failed; i++) {
            const rd_kafka_error_t *err = rk.TopicDescription_error(descs[i]);
            const rd_kafka_Uuid_t *id = rk.TopicDescription_topic_id(descs[i]);
            const char *name = rk.TopicDescription_name(descs[i]);
            const char *text = id ? rk.Uuid_base64str(id) : NULL;
            if ((err != NULL && rk.error_code(err) != 0) || name == NULL || text == NULL ||
                !*text)
                continue;
            PyObject *v = PyUnicode_FromString(text);
            failed = v == NULL || PyDict_SetItemString(out, name, v) < 0;
            Py_XDECREF(v);
        }
    }
    PyObject *result = failed ? NULL : Py_BuildValue("(Os)", out, why);
    if (ev)
        rk.event_destroy(ev);
    if (tc)
        rk.TopicCollection_destroy(tc);
    if (opts)
        rk.AdminOptions_destroy(opts);
    if (q)
        rk.queue_destroy(q);
    Py_DECREF(out);
    return result;
fail:
    Py_DECREF(held);
    Py_DECREF(out);
    PyMem_Free(cn);
    return NULL;
}

static PyMethodDef methods[] = {
    {"load", load, METH_VARARGS,
     "load(path, consumer_type) -> version: open librdkafka at path, for consumers of the type"},
    {"coalesce", coalesce, METH_O,
     "coalesce(records) -> entries: the scan's rules on (topic, partition, offset, headers, "
     "value, timestamp) records"},
    {"split_headers", split_headers, METH_O,
     "split_headers(headers) -> (txn_raw, marker, user, delay): txnstream.message's rule"},
    {"murmur2_partitions", murmur2_partitions, METH_VARARGS,
     "murmur2_partitions(keys, n) -> list: Kafka's default partition of each key (-1: None)"},
    {"topic_ids", topic_ids, METH_VARARGS,
     "topic_ids(consumer, prefix, names, timeout_ms) -> ({name: id}, why or None): Kafka's "
     "topic ids, asked through the consumer's handle"},
    {"take_rows", take_rows, METH_VARARGS,
     "take_rows(batch, i, pos, end, skip, spans, names, plain, cols) -> (i, pos, ended): the "
     "Spark source task's filter, common shapes (txnstream_spark.take)"},
    {NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "txnstream._native",
                                    "The buffer owner's scan, in C (txnstream.buffer.scan).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&ScanType) < 0 || PyType_Ready(&MakerType) < 0 ||
        PyType_Ready(&WakeType) < 0)
        return NULL;
#define INTERN(var, text)                                                                  \
    if (var == NULL && (var = PyUnicode_InternFromString(text)) == NULL)                   \
        return NULL;
    INTERN(s_error, "error")
    INTERN(s_offset, "offset")
    INTERN(s_headers, "headers")
    INTERN(s_key, "key")
    INTERN(s_value, "value")
    INTERN(s_timestamp, "timestamp")
#undef INTERN
    if (no_headers == NULL && (no_headers = PyList_New(0)) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Scan", (PyObject *)&ScanType) < 0 ||
        PyModule_AddObjectRef(m, "Maker", (PyObject *)&MakerType) < 0 ||
        PyModule_AddObjectRef(m, "Wake", (PyObject *)&WakeType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
