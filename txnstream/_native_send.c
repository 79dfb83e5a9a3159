/*
 * txnstream._native_send: Producer.send_batch's records handed to librdkafka in C.
 *
 * Through confluent-kafka each record costs a produce() call with a header list and a
 * Python delivery callback, and each delivery report a Message object. Here a Sender owns
 * a librdkafka producer handle of its own (rd_kafka_new from the librdkafka confluent-kafka
 * loaded: load() opens it by path and Python checks its version against confluent-kafka's),
 * made from the same settings as the Producer's confluent-kafka handle. Not confluent-kafka's
 * handle: its delivery-report callback takes every message's opaque for its own state.
 *
 * A Tally counts one transaction's records sent through a Sender: every message's opaque
 * is its tally, and the delivery-report callback (run by the Sender's poll thread, or by
 * flush(), never with the GIL) counts the acknowledgement, keeps the offset per partition
 * (or counts one without an offset: a retried write the broker had taken) and the first
 * error with its partition. Python takes what arrived with Tally.take(), and makes of it
 * what txnstream/producer.py's Python delivery callback makes of each record; no domain
 * rules are here.
 *
 * Lifetimes: a Tally object holds its Sender; its counts (tally_t) stay alive, after the
 * object is gone, until its last message is reported (the callback frees it then) or
 * the Sender is deallocated (after rd_kafka_destroy: no report comes any more).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

/* ---- the part of librdkafka's public ABI used here (rdkafka.h, stable since 1.0) ---- */
typedef struct rd_kafka_s rd_kafka_t;
typedef struct rd_kafka_conf_s rd_kafka_conf_t;
typedef struct rd_kafka_topic_s rd_kafka_topic_t;
typedef struct rd_kafka_headers_s rd_kafka_headers_t;
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
#define RD_KAFKA_PRODUCER 0
#define RD_KAFKA_CONF_OK 0
#define RD_KAFKA_MSG_F_COPY 0x2
#define RD_KAFKA_RESP_ERR__QUEUE_FULL (-184)
enum { /* rd_kafka_vtype_t */
    VTYPE_END, VTYPE_TOPIC, VTYPE_RKT, VTYPE_PARTITION, VTYPE_VALUE, VTYPE_KEY, VTYPE_OPAQUE,
    VTYPE_MSGFLAGS, VTYPE_TIMESTAMP, VTYPE_HEADER, VTYPE_HEADERS
};

/* rd_kafka_metadata()'s answer: only the leading fields read here (rdkafka.h's layout). */
typedef struct {
    char *topic;
    int partition_cnt;
    void *partitions;
    rd_kafka_resp_err_t err;
} rd_kafka_metadata_topic_t;
typedef struct {
    int broker_cnt;
    void *brokers;
    int topic_cnt;
    rd_kafka_metadata_topic_t *topics;
} rd_kafka_metadata_t;

typedef void (*dr_msg_cb_t)(rd_kafka_t *, const rd_kafka_message_t *, void *);
typedef void (*log_cb_t)(const rd_kafka_t *, int, const char *, const char *);
typedef void (*error_cb_t)(rd_kafka_t *, int, const char *, void *);

static struct {
    int (*version)(void);
    rd_kafka_conf_t *(*conf_new)(void);
    int (*conf_set)(rd_kafka_conf_t *, const char *, const char *, char *, size_t);
    void (*conf_destroy)(rd_kafka_conf_t *);
    void (*conf_set_dr_msg_cb)(rd_kafka_conf_t *, dr_msg_cb_t);
    void (*conf_set_log_cb)(rd_kafka_conf_t *, log_cb_t);
    void (*conf_set_error_cb)(rd_kafka_conf_t *, error_cb_t);
    void (*conf_set_opaque)(rd_kafka_conf_t *, void *);
    rd_kafka_t *(*new_)(int, rd_kafka_conf_t *, char *, size_t);
    void (*destroy)(rd_kafka_t *);
    void *(*opaque)(const rd_kafka_t *);
    int (*poll)(rd_kafka_t *, int);
    rd_kafka_resp_err_t (*flush)(rd_kafka_t *, int);
    int (*outq_len)(rd_kafka_t *);
    rd_kafka_topic_t *(*topic_new)(rd_kafka_t *, const char *, void *);
    void (*topic_destroy)(rd_kafka_topic_t *);
    rd_kafka_resp_err_t (*producev)(rd_kafka_t *, ...);
    rd_kafka_headers_t *(*headers_new)(size_t);
    void (*headers_destroy)(rd_kafka_headers_t *);
    rd_kafka_headers_t *(*headers_copy)(const rd_kafka_headers_t *);
    rd_kafka_resp_err_t (*header_add)(rd_kafka_headers_t *, const char *, ssize_t, const void *,
                                      ssize_t);
    const char *(*err2str)(rd_kafka_resp_err_t);
    rd_kafka_resp_err_t (*metadata)(rd_kafka_t *, int, rd_kafka_topic_t *,
                                    const rd_kafka_metadata_t **, int);
    void (*metadata_destroy)(const rd_kafka_metadata_t *);
} rk;
static void *rk_lib = NULL;

/* ---- a transaction's counts ---- */
typedef struct {
    int32_t partition;
    int64_t *offs; /* offsets reported since the last take() */
    size_t n, cap;
    int64_t unknown; /* records reported without an offset since the last take() */
} part_t;

typedef struct tally_s {
    int64_t sent, acked, taken; /* taken: acks take() has handed to Python */
    part_t *parts;
    size_t nparts, cap;
    rd_kafka_resp_err_t err; /* the first failed record's error, its partition */
    int32_t err_partition;
    int err_taken, orphan; /* orphan: its Tally object is gone */
    struct tally_s *prev, *next;
} tally_t;

typedef struct {
    int level;
    char *fac, *text;
} logline_t;

#define MAX_LOGS 256

typedef struct {
    PyObject_HEAD
    rd_kafka_t *rk;     /* NULL once close() began: no call starts using it */
    rd_kafka_t *owned;  /* the handle until close() destroys it (the poll thread's) */
    rd_kafka_topic_t *rkt;
    pthread_t poller;
    int polling;
    atomic_int closing;
    atomic_int busy;     /* produce() and flush() calls using rk without the GIL */
    atomic_int flushing; /* flush() calls running: the poll thread leaves the reports to
                          * them, so the last report wakes the flush, not the thread */
    pthread_mutex_t mu; /* the tallies and the log lines */
    tally_t tallies;    /* a ring's head: every tally_t of this Sender */
    logline_t logs[MAX_LOGS];
    int nlogs;
    long dropped_logs;
} Sender;

typedef struct {
    PyObject_HEAD
    Sender *sender;
    tally_t *t;
} Tally;

static void tally_free(tally_t *t) { /* mutex held */
    t->prev->next = t->next;
    t->next->prev = t->prev;
    for (size_t i = 0; i < t->nparts; i++)
        free(t->parts[i].offs);
    free(t->parts);
    free(t);
}

static part_t *part_of(tally_t *t, int32_t partition) { /* mutex held; NULL: no memory */
    for (size_t i = 0; i < t->nparts; i++)
        if (t->parts[i].partition == partition)
            return &t->parts[i];
    if (t->nparts == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 4;
        part_t *p = realloc(t->parts, cap * sizeof *p);
        if (p == NULL)
            return NULL;
        t->parts = p;
        t->cap = cap;
    }
    part_t *p = &t->parts[t->nparts++];
    *p = (part_t){partition, NULL, 0, 0, 0};
    return p;
}

/* The delivery report of one record: run by librdkafka's poll in the Sender's thread or
 * in flush(), without the GIL. */
static void on_delivery(rd_kafka_t *h, const rd_kafka_message_t *m, void *opaque) {
    Sender *s = opaque;
    tally_t *t = m->_private;
    if (t == NULL)
        return;
    pthread_mutex_lock(&s->mu);
    t->acked++;
    if (m->err) {
        if (!t->err) {
            t->err = m->err;
            t->err_partition = m->partition;
        }
    } else {
        part_t *p = part_of(t, m->partition);
        if (p == NULL) { /* out of memory: say so as the txn's error, never lose it */
            if (!t->err) {
                t->err = -150; /* RD_KAFKA_RESP_ERR__FAIL */
                t->err_partition = m->partition;
            }
        } else if (m->offset < 0) {
            p->unknown++;
        } else {
            if (p->n == p->cap) {
                size_t cap = p->cap ? p->cap * 2 : 256;
                int64_t *o = realloc(p->offs, cap * sizeof *o);
                if (o != NULL) {
                    p->offs = o;
                    p->cap = cap;
                }
            }
            if (p->n < p->cap)
                p->offs[p->n++] = m->offset;
            else if (!t->err) {
                t->err = -150;
                t->err_partition = m->partition;
            }
        }
    }
    if (t->orphan && t->acked == t->sent)
        tally_free(t);
    pthread_mutex_unlock(&s->mu);
}

static void add_log(Sender *s, int level, const char *fac, const char *text) {
    pthread_mutex_lock(&s->mu);
    if (s->nlogs == MAX_LOGS) {
        s->dropped_logs++;
    } else {
        logline_t *l = &s->logs[s->nlogs];
        l->level = level;
        l->fac = strdup(fac ? fac : "");
        l->text = strdup(text ? text : "");
        if (l->fac != NULL && l->text != NULL) {
            s->nlogs++;
        } else {
            free(l->fac);
            free(l->text);
            s->dropped_logs++;
        }
    }
    pthread_mutex_unlock(&s->mu);
}

/* librdkafka's log lines and errors wait for Python (Sender.logs()): these run on its own
 * threads, where calling into Python would need the GIL. */
static void on_log(const rd_kafka_t *h, int level, const char *fac, const char *buf) {
    Sender *s = rk.opaque(h);
    if (s != NULL)
        add_log(s, level, fac, buf);
}

static void on_error(rd_kafka_t *h, int err, const char *reason, void *opaque) {
    add_log(opaque, 3, "ERROR", reason);
}

/* Serves the reports while no flush() does. A flush serves them itself: rd_kafka_flush()
 * returns when its own poll sees the last record reported, and waits out its timeout if
 * this thread took that report instead (a commit would wait up to a flush slice more). */
static void *poll_loop(void *arg) {
    Sender *s = arg;
    const struct timespec ms = {0, 1000000};
    while (!atomic_load(&s->closing)) {
        if (atomic_load(&s->flushing))
            nanosleep(&ms, NULL);
        else
            rk.poll(s->owned, 10);
    }
    return NULL;
}

/* ---- load(path) ---- */
static PyObject *load(PyObject *self, PyObject *args) {
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path))
        return NULL;
    if (rk_lib != NULL)
        return PyLong_FromLong(rk.version());
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
    SYM(conf_new, "rd_kafka_conf_new");
    SYM(conf_set, "rd_kafka_conf_set");
    SYM(conf_destroy, "rd_kafka_conf_destroy");
    SYM(conf_set_dr_msg_cb, "rd_kafka_conf_set_dr_msg_cb");
    SYM(conf_set_log_cb, "rd_kafka_conf_set_log_cb");
    SYM(conf_set_error_cb, "rd_kafka_conf_set_error_cb");
    SYM(conf_set_opaque, "rd_kafka_conf_set_opaque");
    SYM(new_, "rd_kafka_new");
    SYM(destroy, "rd_kafka_destroy");
    SYM(opaque, "rd_kafka_opaque");
    SYM(poll, "rd_kafka_poll");
    SYM(flush, "rd_kafka_flush");
    SYM(outq_len, "rd_kafka_outq_len");
    SYM(topic_new, "rd_kafka_topic_new");
    SYM(topic_destroy, "rd_kafka_topic_destroy");
    SYM(producev, "rd_kafka_producev");
    SYM(headers_new, "rd_kafka_headers_new");
    SYM(headers_destroy, "rd_kafka_headers_destroy");
    SYM(headers_copy, "rd_kafka_headers_copy");
    SYM(header_add, "rd_kafka_header_add");
    SYM(err2str, "rd_kafka_err2str");
    SYM(metadata, "rd_kafka_metadata");
    SYM(metadata_destroy, "rd_kafka_metadata_destroy");
#undef SYM
    rk_lib = lib;
    return PyLong_FromLong(rk.version());
}

/* ---- Sender ---- */
static int Sender_init(Sender *s, PyObject *args, PyObject *kw) {
    PyObject *settings;
    const char *topic = NULL; /* None: bound later (bind()), e.g. a spare made ahead */
    if (!PyArg_ParseTuple(args, "O!z", &PyList_Type, &settings, &topic))
        return -1;
    if (rk_lib == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "load() librdkafka first");
        return -1;
    }
    if (s->rk != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a Sender is made once");
        return -1;
    }
    rd_kafka_conf_t *conf = rk.conf_new();
    char errstr[512];
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(settings); i++) {
        const char *name, *value;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(settings, i), "ss;a setting is (name, value)",
                              &name, &value)) {
            rk.conf_destroy(conf);
            return -1;
        }
        if (rk.conf_set(conf, name, value, errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
            /* The value is not shown: it may be a secret. */
            PyErr_Format(PyExc_ValueError, "librdkafka refused the setting %s", name);
            rk.conf_destroy(conf);
            return -1;
        }
    }
    rk.conf_set_dr_msg_cb(conf, on_delivery);
    rk.conf_set_log_cb(conf, on_log);
    rk.conf_set_error_cb(conf, on_error);
    rk.conf_set_opaque(conf, s);
    rd_kafka_t *h = rk.new_(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
    if (h == NULL) {
        rk.conf_destroy(conf);
        PyErr_Format(PyExc_RuntimeError, "librdkafka made no producer: %s", errstr);
        return -1;
    }
    rd_kafka_topic_t *rkt = topic == NULL ? NULL : rk.topic_new(h, topic, NULL);
    if (topic != NULL && rkt == NULL) {
        rk.destroy(h);
        PyErr_Format(PyExc_RuntimeError, "librdkafka made no handle for topic %s", topic);
        return -1;
    }
    s->rk = s->owned = h;
    s->rkt = rkt;
    atomic_store(&s->closing, 0);
    if (pthread_create(&s->poller, NULL, poll_loop, s) != 0) {
        if (rkt != NULL)
            rk.topic_destroy(rkt);
        rk.destroy(h);
        s->rk = s->owned = NULL;
        s->rkt = NULL;
        PyErr_SetString(PyExc_RuntimeError, "cannot start the delivery-report thread");
        return -1;
    }
    s->polling = 1;
    return 0;
}

static PyObject *Sender_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    Sender *s = (Sender *)type->tp_alloc(type, 0);
    if (s == NULL)
        return NULL;
    pthread_mutex_init(&s->mu, NULL);
    s->tallies.prev = s->tallies.next = &s->tallies;
    return (PyObject *)s;
}

/* The handle for a call that uses it without the GIL (close() waits for the call), or
 * NULL (closed). Pair with sender_done(). */
static rd_kafka_t *sender_rk(Sender *s) {
    if (s->rk == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the native producer is closed");
        return NULL;
    }
    atomic_fetch_add(&s->busy, 1);
    return s->rk;
}

static void sender_done(Sender *s) { atomic_fetch_sub(&s->busy, 1); }

static PyTypeObject TallyType;

/* Prototype headers per partition: {partition: [(name, bytes | str | None), ...]}. */
static int build_headers(PyObject *by_part, rd_kafka_headers_t ***out, int32_t *nout) {
    *out = NULL;
    *nout = 0;
    if (!PyDict_Check(by_part)) {
        PyErr_SetString(PyExc_TypeError, "headers are a dict {partition: [(name, value)]}");
        return -1;
    }
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    long max = -1;
    while (PyDict_Next(by_part, &pos, &k, &v)) {
        long p = PyLong_AsLong(k);
        if (p == -1 && PyErr_Occurred())
            return -1;
        if (p < 0 || p > INT32_MAX - 1) {
            PyErr_Format(PyExc_ValueError, "partition %ld", p);
            return -1;
        }
        if (p > max)
            max = p;
    }
    rd_kafka_headers_t **hs = calloc((size_t)max + 1, sizeof *hs);
    if (hs == NULL && max >= 0) {
        PyErr_NoMemory();
        return -1;
    }
    *out = hs;
    *nout = (int32_t)(max + 1);
    pos = 0;
    while (PyDict_Next(by_part, &pos, &k, &v)) {
        long p = PyLong_AsLong(k);
        PyObject *seq = PySequence_Fast(v, "a partition's headers are a sequence");
        if (seq == NULL)
            return -1;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        rd_kafka_headers_t *h = hs[p] = rk.headers_new((size_t)n);
        for (Py_ssize_t i = 0; i < n; i++) {
            const char *name;
            PyObject *value;
            Py_ssize_t nlen;
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "s#O;a header is (name, "
                                  "value)", &name, &nlen, &value)) {
                Py_DECREF(seq);
                return -1;
            }
            const char *data = NULL;
            Py_ssize_t size = 0;
            if (PyBytes_Check(value)) {
                data = PyBytes_AS_STRING(value);
                size = PyBytes_GET_SIZE(value);
            } else if (PyUnicode_Check(value)) {
                data = PyUnicode_AsUTF8AndSize(value, &size);
                if (data == NULL) {
                    Py_DECREF(seq);
                    return -1;
                }
            } else if (value != Py_None) {
                PyErr_Format(PyExc_TypeError, "a header's value is bytes, str or None, not %s",
                             Py_TYPE(value)->tp_name);
                Py_DECREF(seq);
                return -1;
            }
            rk.header_add(h, name, nlen, data, data ? size : 0);
        }
        Py_DECREF(seq);
    }
    return 0;
}

static void free_headers(rd_kafka_headers_t **hs, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        if (hs[i] != NULL)
            rk.headers_destroy(hs[i]);
    free(hs);
}

typedef struct {
    const char *ptr;
    size_t len;
} mem_t;

static int as_mem(PyObject *o, Py_ssize_t i, const char *what, mem_t *m) {
    if (o == Py_None) {
        *m = (mem_t){NULL, 0};
        return 0;
    }
    if (!PyBytes_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s[%zd] is bytes or None, not %s", what, i,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    *m = (mem_t){PyBytes_AS_STRING(o), (size_t)PyBytes_GET_SIZE(o)};
    return 0;
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* produce(tally, values, keys, partitions, headers, start, wait_ms) -> (next, err)
 *
 * Hands records start.. to librdkafka, in order, each with its partition's headers and
 * the tally as its opaque, until all are handed (next == len), one is refused (err: its
 * librdkafka error code; next: its index), or librdkafka's queue stayed full for wait_ms
 * (err 0, next < len: the caller calls again from next). Without the GIL while producing;
 * the records are held by tuples made first, so a caller's list may change meanwhile. */
static PyObject *Sender_produce(Sender *s, PyObject *args) {
    PyObject *tally_obj, *values_in, *keys_in, *parts_in, *by_part;
    Py_ssize_t start;
    int wait_ms;
    if (!PyArg_ParseTuple(args, "OOOOOni", &tally_obj, &values_in, &keys_in, &parts_in,
                          &by_part, &start, &wait_ms))
        return NULL;
    Tally *tally = (Tally *)tally_obj;
    if (!PyObject_TypeCheck(tally_obj, &TallyType) || tally->sender != s) {
        PyErr_SetString(PyExc_TypeError, "a Tally of this Sender");
        return NULL;
    }
    if (s->rk != NULL && s->rkt == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the native producer has no topic: bind() it");
        return NULL;
    }
    rd_kafka_t *h = sender_rk(s);
    if (h == NULL)
        return NULL;
    PyObject *values = NULL, *keys = NULL, *parts = NULL, *result = NULL;
    mem_t *vm = NULL, *km = NULL;
    int32_t *pm = NULL;
    rd_kafka_headers_t **hs = NULL;
    int32_t nhs = 0;
    values = PySequence_Tuple(values_in);
    keys = keys_in == Py_None ? Py_NewRef(Py_None) : PySequence_Tuple(keys_in);
    parts = PySequence_Tuple(parts_in);
    if (values == NULL || keys == NULL || parts == NULL)
        goto done;
    Py_ssize_t n = PyTuple_GET_SIZE(values);
    if (PyTuple_GET_SIZE(parts) != n || (keys != Py_None && PyTuple_GET_SIZE(keys) != n)) {
        PyErr_SetString(PyExc_ValueError, "values, keys and partitions differ in length");
        goto done;
    }
    if (start < 0 || start > n) {
        PyErr_SetString(PyExc_ValueError, "start out of range");
        goto done;
    }
    if (build_headers(by_part, &hs, &nhs) < 0)
        goto done;
    Py_ssize_t m = n - start;
    vm = PyMem_Malloc((size_t)(m ? m : 1) * sizeof *vm);
    km = PyMem_Malloc((size_t)(m ? m : 1) * sizeof *km);
    pm = PyMem_Malloc((size_t)(m ? m : 1) * sizeof *pm);
    if (vm == NULL || km == NULL || pm == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < m; i++) {
        if (as_mem(PyTuple_GET_ITEM(values, start + i), start + i, "values", &vm[i]) < 0)
            goto done;
        if (keys == Py_None)
            km[i] = (mem_t){NULL, 0};
        else if (as_mem(PyTuple_GET_ITEM(keys, start + i), start + i, "keys", &km[i]) < 0)
            goto done;
        long p = PyLong_AsLong(PyTuple_GET_ITEM(parts, start + i));
        if (p == -1 && PyErr_Occurred())
            goto done;
        if (p < 0 || p >= nhs || hs[p] == NULL) {
            PyErr_Format(PyExc_ValueError, "partitions[%zd] = %ld has no headers", start + i,
                         p);
            goto done;
        }
        pm[i] = (int32_t)p;
    }
    tally_t *t = tally->t;
    pthread_mutex_lock(&s->mu);
    t->sent += m; /* before the first report can come; what is not handed is taken back */
    pthread_mutex_unlock(&s->mu);
    Py_ssize_t i = 0;
    rd_kafka_resp_err_t err = 0;
    rd_kafka_topic_t *rkt = s->rkt;
    Py_BEGIN_ALLOW_THREADS
    int64_t full_since = -1;
    while (i < m) {
        rd_kafka_headers_t *hc = rk.headers_copy(hs[pm[i]]);
        err = rk.producev(h, VTYPE_RKT, rkt, VTYPE_PARTITION, pm[i], VTYPE_VALUE,
                          (void *)vm[i].ptr, vm[i].len, VTYPE_KEY, (void *)km[i].ptr, km[i].len,
                          VTYPE_MSGFLAGS, RD_KAFKA_MSG_F_COPY, VTYPE_OPAQUE, (void *)t,
                          VTYPE_HEADERS, hc, VTYPE_END);
        if (err == 0) {
            i++;
            full_since = -1;
            continue;
        }
        rk.headers_destroy(hc); /* librdkafka takes them only with the record */
        if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
            break;
        int64_t now = now_ms();
        if (full_since < 0)
            full_since = now;
        else if (now - full_since >= wait_ms) {
            err = 0; /* the caller calls again (and may be interrupted meanwhile) */
            break;
        }
        rk.poll(h, 10); /* let it drain (the thread serves the reports too) */
    }
    Py_END_ALLOW_THREADS
    pthread_mutex_lock(&s->mu);
    t->sent -= m - i;
    pthread_mutex_unlock(&s->mu);
    result = Py_BuildValue("(ni)", start + i, (int)err);
done:
    sender_done(s);
    if (hs != NULL)
        free_headers(hs, nhs);
    PyMem_Free(vm);
    PyMem_Free(km);
    PyMem_Free(pm);
    Py_XDECREF(values);
    Py_XDECREF(keys);
    Py_XDECREF(parts);
    return result;
}

/* The handle for a call taking (timeout_ms), marked busy (sender_done() after); NULL with
 * an exception set if the arguments are wrong or the Sender is closed. */
static rd_kafka_t *sender_rk_timeout(Sender *s, PyObject *args, int *timeout_ms) {
    if (!PyArg_ParseTuple(args, "i", timeout_ms))
        return NULL;
    return sender_rk(s);
}

static PyObject *Sender_flush(Sender *s, PyObject *args) {
    int timeout_ms;
    rd_kafka_t *h = sender_rk_timeout(s, args, &timeout_ms);
    if (h == NULL)
        return NULL;
    int left;
    Py_BEGIN_ALLOW_THREADS
    atomic_fetch_add(&s->flushing, 1);
    rk.flush(h, timeout_ms);
    atomic_fetch_sub(&s->flushing, 1);
    left = rk.outq_len(h);
    Py_END_ALLOW_THREADS
    sender_done(s);
    return PyLong_FromLong(left);
}

/* partitions(timeout_ms) -> the topic's partition count, asked of the cluster now. The
 * answer also refreshes the handle's own metadata, so a partition added since it was made
 * can be produced to (librdkafka refuses a partition its metadata does not have). */
static PyObject *Sender_partitions(Sender *s, PyObject *args) {
    int timeout_ms;
    rd_kafka_t *h = sender_rk_timeout(s, args, &timeout_ms);
    if (h == NULL)
        return NULL;
    rd_kafka_topic_t *rkt = s->rkt; /* read with the GIL: close() clears it */
    if (rkt == NULL) {
        sender_done(s);
        PyErr_SetString(PyExc_RuntimeError, "the native producer has no topic: bind() it");
        return NULL;
    }
    const rd_kafka_metadata_t *md = NULL;
    rd_kafka_resp_err_t err;
    int count = -1;
    Py_BEGIN_ALLOW_THREADS
    err = rk.metadata(h, 0, rkt, &md, timeout_ms);
    if (!err && md != NULL && md->topic_cnt == 1 && !md->topics[0].err)
        count = md->topics[0].partition_cnt;
    if (md != NULL)
        rk.metadata_destroy(md);
    Py_END_ALLOW_THREADS
    sender_done(s);
    if (err) {
        PyErr_Format(PyExc_RuntimeError, "no metadata for the topic: %s", rk.err2str(err));
        return NULL;
    }
    return PyLong_FromLong(count);
}

static PyObject *Sender_pending(Sender *s, PyObject *ignored) {
    if (s->rk == NULL)
        return PyLong_FromLong(0);
    return PyLong_FromLong(rk.outq_len(s->rk)); /* with the GIL: close() cannot run */
}

static PyObject *Sender_logs(Sender *s, PyObject *ignored) {
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    pthread_mutex_lock(&s->mu);
    int n = s->nlogs;
    long dropped = s->dropped_logs;
    logline_t lines[MAX_LOGS];
    memcpy(lines, s->logs, (size_t)n * sizeof *lines);
    s->nlogs = 0;
    s->dropped_logs = 0;
    pthread_mutex_unlock(&s->mu);
    int failed = 0;
    for (int i = 0; i < n; i++) {
        if (!failed) {
            PyObject *item = Py_BuildValue("(iss)", lines[i].level, lines[i].fac, lines[i].text);
            if (item == NULL || PyList_Append(out, item) < 0)
                failed = 1;
            Py_XDECREF(item);
        }
        free(lines[i].fac);
        free(lines[i].text);
    }
    if (!failed && dropped) {
        PyObject *item = Py_BuildValue("(iss)", 4, "LOGS", "log lines dropped (too many)");
        if (item == NULL || PyList_Append(out, item) < 0)
            failed = 1;
        Py_XDECREF(item);
    }
    if (failed) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* close(timeout_ms) -> left: flush, stop the thread, destroy the handle. */
static PyObject *Sender_close(Sender *s, PyObject *args) {
    int timeout_ms = 0;
    if (args != NULL && !PyArg_ParseTuple(args, "|i", &timeout_ms))
        return NULL;
    int left = 0;
    if (s->rk == NULL)
        return PyLong_FromLong(0);
    rd_kafka_t *h = s->rk;
    rd_kafka_topic_t *rkt = s->rkt;
    s->rk = NULL; /* no produce() starts any more (a running one holds a reference) */
    s->rkt = NULL;
    Py_BEGIN_ALLOW_THREADS
    while (atomic_load(&s->busy)) { /* a produce() or flush() still using the handle */
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    rk.flush(h, timeout_ms);
    left = rk.outq_len(h);
    atomic_store(&s->closing, 1);
    if (s->polling)
        pthread_join(s->poller, NULL);
    if (rkt != NULL)
        rk.topic_destroy(rkt);
    rk.destroy(h);
    Py_END_ALLOW_THREADS
    s->polling = 0;
    s->owned = NULL;
    return PyLong_FromLong(left);
}

static PyObject *Sender_tally(Sender *s, PyObject *ignored);

/* bind(topic): the topic of a Sender made without one (a spare, its connections and
 * producer id made ahead); once. */
static PyObject *Sender_bind(Sender *s, PyObject *args) {
    const char *topic;
    if (!PyArg_ParseTuple(args, "s", &topic))
        return NULL;
    if (s->rk == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the native producer is closed");
        return NULL;
    }
    if (s->rkt != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the native producer has its topic already");
        return NULL;
    }
    rd_kafka_topic_t *rkt = rk.topic_new(s->rk, topic, NULL);
    if (rkt == NULL) {
        PyErr_Format(PyExc_RuntimeError, "librdkafka made no handle for topic %s", topic);
        return NULL;
    }
    s->rkt = rkt;
    Py_RETURN_NONE;
}

static void Sender_dealloc(Sender *s) {
    PyObject *r = Sender_close(s, NULL);
    if (r == NULL)
        PyErr_Clear();
    Py_XDECREF(r);
    pthread_mutex_lock(&s->mu);
    while (s->tallies.next != &s->tallies) /* orphans: no report comes after destroy */
        tally_free(s->tallies.next);
    for (int i = 0; i < s->nlogs; i++) {
        free(s->logs[i].fac);
        free(s->logs[i].text);
    }
    s->nlogs = 0;
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_destroy(&s->mu);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyMethodDef Sender_methods[] = {
    {"tally", (PyCFunction)Sender_tally, METH_NOARGS,
     "tally() -> Tally: counts for one transaction's records"},
    {"produce", (PyCFunction)Sender_produce, METH_VARARGS,
     "produce(tally, values, keys, partitions, headers, start, wait_ms) -> (next, err)"},
    {"flush", (PyCFunction)Sender_flush, METH_VARARGS,
     "flush(timeout_ms) -> records not yet reported"},
    {"partitions", (PyCFunction)Sender_partitions, METH_VARARGS,
     "partitions(timeout_ms) -> the topic's partition count now (-1: unknown); refreshes"},
    {"pending", (PyCFunction)Sender_pending, METH_NOARGS,
     "pending() -> records not yet reported (librdkafka's outq_len)"},
    {"logs", (PyCFunction)Sender_logs, METH_NOARGS,
     "logs() -> [(level, facility, text)]: librdkafka's log lines and errors since the last"},
    {"bind", (PyCFunction)Sender_bind, METH_VARARGS,
     "bind(topic): the topic of a Sender made without one; once"},
    {"close", (PyCFunction)Sender_close, METH_VARARGS,
     "close(timeout_ms=0) -> records left: flush, then destroy the handle"},
    {NULL}};

static PyTypeObject SenderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "txnstream._native_send.Sender",
    .tp_basicsize = sizeof(Sender),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Sender(settings, topic): a librdkafka producer of its own for one topic "
              "(None: bound later with bind()).",
    .tp_new = Sender_new,
    .tp_init = (initproc)Sender_init,
    .tp_dealloc = (destructor)Sender_dealloc,
    .tp_methods = Sender_methods,
};

/* ---- Tally ---- */

static PyObject *Sender_tally(Sender *s, PyObject *ignored) {
    tally_t *t = calloc(1, sizeof *t);
    if (t == NULL)
        return PyErr_NoMemory();
    Tally *o = PyObject_New(Tally, &TallyType);
    if (o == NULL) {
        free(t);
        return NULL;
    }
    o->sender = (Sender *)Py_NewRef(s);
    o->t = t;
    pthread_mutex_lock(&s->mu);
    t->next = s->tallies.next;
    t->prev = &s->tallies;
    t->next->prev = t;
    s->tallies.next = t;
    pthread_mutex_unlock(&s->mu);
    return (PyObject *)o;
}

/* take() -> (acked, offsets, unknown, error): what arrived since the last take():
 * how many records were reported, {partition: bytes of int64 offsets (native order)} or
 * None, {partition: records reported without an offset} or None, and the first failed
 * record's (error code, partition) once, else None. */
static PyObject *Tally_take(Tally *o, PyObject *ignored) {
    Sender *s = o->sender;
    tally_t *t = o->t;
    PyObject *offsets = NULL, *unknown = NULL, *error = NULL, *result = NULL;
    pthread_mutex_lock(&s->mu);
    int64_t acked = t->acked - t->taken;
    for (size_t i = 0; i < t->nparts; i++) { /* first build; reset only if all is built */
        part_t *p = &t->parts[i];
        if (p->n) {
            if (offsets == NULL && (offsets = PyDict_New()) == NULL)
                goto fail;
            PyObject *k = PyLong_FromLong(p->partition);
            PyObject *b = PyBytes_FromStringAndSize((const char *)p->offs,
                                                    (Py_ssize_t)(p->n * sizeof *p->offs));
            int rc = k && b ? PyDict_SetItem(offsets, k, b) : -1;
            Py_XDECREF(k);
            Py_XDECREF(b);
            if (rc < 0)
                goto fail;
        }
        if (p->unknown) {
            if (unknown == NULL && (unknown = PyDict_New()) == NULL)
                goto fail;
            PyObject *k = PyLong_FromLong(p->partition);
            PyObject *c = PyLong_FromLongLong(p->unknown);
            int rc = k && c ? PyDict_SetItem(unknown, k, c) : -1;
            Py_XDECREF(k);
            Py_XDECREF(c);
            if (rc < 0)
                goto fail;
        }
    }
    if (t->err && !t->err_taken &&
        (error = Py_BuildValue("(ii)", (int)t->err, (int)t->err_partition)) == NULL)
        goto fail;
    result = Py_BuildValue("(LOOO)", (long long)acked, offsets ? offsets : Py_None,
                           unknown ? unknown : Py_None, error ? error : Py_None);
    if (result == NULL)
        goto fail;
    t->taken = t->acked;
    for (size_t i = 0; i < t->nparts; i++)
        t->parts[i].n = t->parts[i].unknown = 0;
    if (error != NULL)
        t->err_taken = 1;
fail: /* out of memory: nothing is taken, all stays for the next take() */
    pthread_mutex_unlock(&s->mu);
    Py_XDECREF(offsets);
    Py_XDECREF(unknown);
    Py_XDECREF(error);
    return result;
}

static PyObject *Tally_outstanding(Tally *o, void *closure) {
    pthread_mutex_lock(&o->sender->mu);
    int64_t n = o->t->sent - o->t->acked;
    pthread_mutex_unlock(&o->sender->mu);
    return PyLong_FromLongLong(n);
}

static void Tally_dealloc(Tally *o) {
    Sender *s = o->sender;
    pthread_mutex_lock(&s->mu);
    if (o->t->acked == o->t->sent)
        tally_free(o->t);
    else
        o->t->orphan = 1; /* its last report frees it, or the Sender's dealloc */
    pthread_mutex_unlock(&s->mu);
    Py_DECREF(s);
    PyObject_Free(o);
}

static PyMethodDef Tally_methods[] = {
    {"take", (PyCFunction)Tally_take, METH_NOARGS,
     "take() -> (acked, {partition: offsets bytes} | None, {partition: n} | None, "
     "(err, partition) | None): the reports since the last take()"},
    {NULL}};

static PyGetSetDef Tally_getset[] = {
    {"outstanding", (getter)Tally_outstanding, NULL, "records handed and not yet reported",
     NULL},
    {NULL}};

static PyTypeObject TallyType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "txnstream._native_send.Tally",
    .tp_basicsize = sizeof(Tally),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One transaction's records through a Sender: reports counted in C.",
    .tp_dealloc = (destructor)Tally_dealloc,
    .tp_methods = Tally_methods,
    .tp_getset = Tally_getset,
};

static PyMethodDef methods[] = {
    {"load", load, METH_VARARGS, "load(path) -> version: open librdkafka at path"},
    {NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "txnstream._native_send",
    "Producer.send_batch's records handed to librdkafka in C (txnstream.kafka.native_send).",
    -1, methods};

PyMODINIT_FUNC PyInit__native_send(void) {
    if (PyType_Ready(&SenderType) < 0 || PyType_Ready(&TallyType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Sender", (PyObject *)&SenderType) < 0 ||
        PyModule_AddObjectRef(m, "Tally", (PyObject *)&TallyType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
