"""TF2 programs placed by baechi_tf.function, one per scenario, each run in a fresh process by
tests/test_tf2_function.py: TF's eager context gets its CPU stand-ins only before it runs anything,
which a pytest worker that ran other tests may have done.

``python tests/tf2_programs.py SCENARIO [ARG]`` prints one line ``RESULT <json>`` last.
"""

import json
import sys

import numpy as np

import baechi_tf
import baechi_tf.tf2

NUM_DEVICES = 4
STEPS = 5
SCENARIOS = {}


def scenario(f):
    SCENARIOS[f.__name__] = f
    return f


def _tf():
    import tensorflow as tf

    return tf


def mlp(seed=0, sizes=(128, 256, 256, 10)):
    """Weights of a small MLP, the same for the same seed."""
    tf = _tf()
    return [
        tf.Variable(tf.random.stateless_normal([a, b], seed=[seed, i]) * 0.1, name=f"w{i}")
        for i, (a, b) in enumerate(zip(sizes, sizes[1:]))
    ]


def loss_of(weights, x, y):
    tf = _tf()
    h = x
    for i, w in enumerate(weights):
        h = tf.matmul(h, w)
        if i + 1 < len(weights):
            h = tf.nn.relu(h)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=h))


def sgd_step(weights):
    tf = _tf()

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_of(weights, x, y)
        for w, g in zip(weights, tape.gradient(loss, weights)):
            w.assign_sub(0.5 * g)
        return loss

    return step


def batch(n, seed=7):
    tf = _tf()
    x = tf.random.stateless_normal([n, 128], seed=[seed, 1])
    y = tf.random.stateless_uniform([n], seed=[seed, 2], maxval=10, dtype=tf.int32)
    return x, y


def where_ops_ran(placed, *args, types=False):
    """(op name -> the device it ran on, the value) of the first call of `placed`: the partition
    graphs that TF's function runtime records, with run metadata on, when it instantiates a
    function. With `types`, a third item: node type -> how many nodes of it ran."""
    from tensorflow.python.eager import context

    ctx = context.context()
    ctx.enable_run_metadata()
    try:
        value = placed(*args)
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    # The placed function's graph: the largest of those instantiated (others copy a tensor, or
    # are Keras's data pipeline).
    graph = max(metadata.function_graphs, key=lambda g: sum(len(p.node) for p in g.partition_graphs))
    nodes = [node for partition in graph.partition_graphs for node in partition.node if node.op not in _RUNTIME_OPS]
    ran = {node.name: node.device for node in nodes}
    if not types:
        return value, ran
    counts = {}
    for node in nodes:
        counts[node.op] = counts.get(node.op, 0) + 1
    return value, ran, counts


_RUNTIME_OPS = frozenset({"_Arg", "_Retval", "_Send", "_Recv", "_HostSend", "_HostRecv"})


def _losses(f, *args, steps=STEPS):
    return [float(f(*args)) for _ in range(steps)]


@scenario
def train():
    """A training loop placed and not, from the same weights."""
    tf = _tf()
    placed_weights, plain_weights = mlp(), mlp()
    # m_topo spreads the loop over the stand-ins whatever the profiled times (`auto` may keep
    # a step this small on one device); the test checks that placed ops run where placed.
    placed = baechi_tf.function(sgd_step(placed_weights), num_devices=NUM_DEVICES, placement_method="m_topo")
    plain = tf.function(sgd_step(plain_weights))
    x, y = batch(512)
    first, ran = where_ops_ran(placed, x, y)
    placed_losses = [float(first)] + _losses(placed, x, y, steps=STEPS - 1)
    return {
        "placed": placed_losses,
        "plain": _losses(plain, x, y),
        "weights_apart": max(float(np.abs(a.numpy() - b.numpy()).max()) for a, b in zip(placed_weights, plain_weights)),
        "ran_on": sorted(set(ran.values())),
        "planned": placed.placement.op_to_device,
        "ran": ran,
        "summary": placed.summary(),
        "placements": len(placed.placements),
    }


@scenario
def signatures():
    """Two batch sizes: each signature placed on its own; losses as unplaced."""
    tf = _tf()
    placed = baechi_tf.function(sgd_step(mlp()), num_devices=NUM_DEVICES)
    plain = tf.function(sgd_step(mlp()))
    out = {"placed": [], "plain": []}
    for n in (256, 64, 256, 64):
        x, y = batch(n)
        out["placed"].append(float(placed(x, y)))
        out["plain"].append(float(plain(x, y)))
    out["placements"] = len(placed.placements)
    return out


@scenario
def method():
    """A decorated method: placed per instance."""
    tf = _tf()

    class Model:
        def __init__(self, seed):
            self.weights = mlp(seed)

        @baechi_tf.function(num_devices=NUM_DEVICES)
        def step(self, x, y):
            return sgd_step(self.weights)(x, y)

    first, second = Model(0), Model(1)
    plain = [tf.function(sgd_step(mlp(seed))) for seed in (0, 1)]
    x, y = batch(128)
    return {
        "placed": [[float(m.step(x, y)) for _ in range(3)] for m in (first, second)],
        "plain": [[float(p(x, y)) for _ in range(3)] for p in plain],
        "placements": [len(m.step.placements) for m in (first, second)],
        "same_object": first.step is first.step,
    }


@scenario
def late_variables():
    """Variables made after decoration: one made between decoration and the first call, and
    two that the first call makes (a lazily built weight and its momentum)."""
    tf = _tf()
    runs = {}
    for kind in ("plain", "placed"):
        state = {}
        step = _late_step(state)
        f = tf.function(step) if kind == "plain" else baechi_tf.function(step, num_devices=NUM_DEVICES)
        with tf.device("/device:CPU:2"):  # made after decoration, on a stand-in
            state["early"] = tf.Variable(tf.random.stateless_normal([128, 256], seed=[4, 4]) * 0.1, name="early")
        x, y = batch(256)
        runs[kind] = _losses(f, x, y)
        runs[kind + "_devices"] = {k: v.device for k, v in state.items()}
        if kind == "placed":
            runs["summary"] = f.summary()
            runs["planned"] = f.placement.op_to_device
    return runs


def _late_step(state):
    tf = _tf()

    def step(x, y):
        if "w" not in state:  # made by the first trace, as tf.function allows
            state["w"] = tf.Variable(tf.random.stateless_normal([256, 10], seed=[3, 3]) * 0.1, name="late_w")
            state["m"] = tf.Variable(tf.zeros([256, 10]), name="momentum")
        with tf.GradientTape() as tape:
            loss = loss_of([state["early"], state["w"]], x, y)
        g_early, g_w = tape.gradient(loss, [state["early"], state["w"]])
        state["m"].assign(0.9 * state["m"] + g_w)
        state["w"].assign_sub(0.1 * state["m"])
        state["early"].assign_sub(0.1 * g_early)
        return loss

    return step


@scenario
def side_effects():
    """Python state that changes the trace: refused, and the variables are as they were."""
    tf = _tf()
    w = tf.Variable(tf.ones([4, 4]), name="w")
    calls = []

    def step(x):
        calls.append(1)
        w.assign_add(tf.matmul(x, w) * float(len(calls)))
        return tf.reduce_sum(w)

    placed = baechi_tf.function(step, num_devices=NUM_DEVICES)
    try:
        placed(tf.ones([4, 4]))
        error = None
    except baechi_tf.BaechiError as e:
        error = f"{type(e).__name__}: {e}"
    return {"error": error, "w": w.numpy().tolist(), "placements": len(placed.placements)}


@scenario
def pinned(device):
    """An op the function pins to `device`."""
    tf = _tf()
    w = tf.Variable(tf.ones([64, 64]), name="w")

    def step(x):
        with tf.device(device):
            h = tf.matmul(x, w)
        w.assign_add(0.01 * h)
        return tf.reduce_sum(tf.tanh(h))

    placed = baechi_tf.function(step, num_devices=NUM_DEVICES)
    x = tf.ones([64, 64])
    out = {"error": None}
    try:
        loss, ran = where_ops_ran(placed, x)
        out.update(loss=float(loss), matmul=placed.placement.op_to_device["MatMul"], ran=ran.get("MatMul"))
    except baechi_tf.BaechiError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    out["w_sum"] = float(w.numpy().sum())
    return out


@scenario
def colocated():
    """Ops the function colocates (``colocate_with``) stay on one device."""
    tf = _tf()
    ws = mlp(seed=1)

    def step(x):
        a = tf.matmul(x, ws[0])
        b = tf.tanh(tf.matmul(x, ws[0]) * 2.0)
        with tf.compat.v1.colocate_with(a.op):
            c = tf.nn.relu(b) + 1.0
        return tf.reduce_sum(tf.matmul(a, ws[1])) + tf.reduce_sum(c)

    placed = baechi_tf.function(step, num_devices=NUM_DEVICES)
    x, _ = batch(256)
    loss, ran = where_ops_ran(placed, x)
    colocated_ops = [op.name for op in placed.unplaced.get_concrete_function(x).graph.get_operations()
                     if op.colocation_groups() == [b"loc:@MatMul"]]
    return {
        "loss": float(loss),
        "plain": float(tf.function(step)(x)),
        "colocated": colocated_ops,
        "planned": {n: placed.placement.op_to_device[n] for n in colocated_ops},
        "ran": {n: ran.get(n) for n in colocated_ops},
    }


@scenario
def reports(folder):
    """report_dir and cost_path of two signatures."""
    tf = _tf()
    placed = baechi_tf.function(
        sgd_step(mlp()), num_devices=NUM_DEVICES, report_dir=f"{folder}/reports", cost_path=f"{folder}/costs.pb"
    )
    for n in (128, 64):
        placed(*batch(n))
    return {"placements": len(placed.placements)}


def keras_model(seed=1):
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((128,)),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dropout(0.2, seed=3),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


@scenario
def keras_fit():
    """model.fit placed and not, from the same weights; evaluate, predict, train_on_batch."""
    import baechi_tf.tf2.keras

    x = np.random.RandomState(0).randn(288, 128).astype("float32")
    y = np.random.RandomState(1).randint(0, 10, 288)
    placed_model, plain_model = keras_model(), keras_model()
    # m_topo spreads the step over the stand-ins whatever the profiled times; `auto` may keep a
    # step this small on one device when its noisy profile says that is fastest.
    placed = baechi_tf.tf2.keras.place(
        placed_model, (x[:64], y[:64]), num_devices=NUM_DEVICES, placement_method="m_topo")
    placed_before_fit = len(placed.placements)
    out = {}
    for kind, model in (("placed", placed_model), ("plain", plain_model)):
        fit = lambda: model.fit(x, y, batch_size=64, epochs=1, verbose=0, shuffle=False).history  # noqa: E731
        first, ran = where_ops_ran(fit) if kind == "placed" else (fit(), None)
        later = model.fit(x, y, batch_size=64, epochs=2, verbose=0, shuffle=False).history
        out[kind] = {
            "loss": first["loss"] + later["loss"],
            "evaluate": model.evaluate(x, y, verbose=0),
            "predict": model.predict(x[:8], verbose=0).tolist(),
            "train_on_batch": float(model.train_on_batch(x[:64], y[:64])[0]),
        }
        if ran is not None:
            out["ran_on"] = sorted(set(ran.values()))
    out["placed_before_fit"] = placed_before_fit
    out["placements"] = len(placed.placements)
    out["summary"] = placed.summary()
    return out


def conv_model(seed=1):
    """A small Keras 3 conv net with biases, a sum of four branches (a chain of three additions)
    and a batch norm: what TF fuses or regroups when the ops are on one device."""
    import keras

    keras.utils.set_random_seed(seed)
    conv = lambda k, **kw: keras.layers.Conv2D(8, k, padding="same", **kw)  # noqa: E731
    inputs = keras.Input((16, 16, 3))
    a = conv(3, activation="relu")(inputs)
    s = keras.layers.Add()([a, conv(3)(a), conv(1)(a), conv(3)(inputs)])
    s = keras.layers.ReLU()(keras.layers.BatchNormalization()(s))
    s = keras.layers.GlobalAveragePooling2D()(conv(3)(s))
    model = keras.Model(inputs, keras.layers.Dense(10)(s))
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


# Node types of what TF fused or regrouped on one device.
_REGROUPED = ("WithBias", "AddN", "Fused")


@scenario
def keras_conv(method="m_topo"):
    """model.fit of `conv_model` placed by `method` and not: the losses, and how many nodes of
    each type that fusing or regrouping makes ran in the first step of each."""
    import baechi_tf.tf2.keras

    x = np.random.RandomState(0).randn(64, 16, 16, 3).astype("float32")
    y = np.random.RandomState(1).randint(0, 10, 64)
    placed_model, plain_model = conv_model(), conv_model()
    baechi_tf.tf2.keras.place(placed_model, (x[:16], y[:16]), num_devices=NUM_DEVICES, placement_method=method)
    out = {}
    for kind, model in (("placed", placed_model), ("plain", plain_model)):
        fit = lambda: model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False).history  # noqa: E731
        first, ran, types = where_ops_ran(fit, types=True)
        later = model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False).history
        out[kind] = {
            "loss": first["loss"] + later["loss"],
            "regrouped": {t: n for t, n in sorted(types.items()) if any(k in t for k in _REGROUPED)},
            "ran_on": sorted(set(ran.values())),
        }
    return out


@scenario
def too_few_devices():
    """TF's eager context set up before decoration, without stand-ins."""
    tf = _tf()
    tf.ones([2])  # TF sets its devices up: one CPU
    try:
        baechi_tf.function(lambda x: x, num_devices=NUM_DEVICES)
        return {"error": None}
    except baechi_tf.BaechiError as e:
        return {"error": f"{type(e).__name__}: {e}"}


if __name__ == "__main__":
    name, *rest = sys.argv[1:]
    if name != "too_few_devices":
        baechi_tf.tf2.standin_devices(NUM_DEVICES)
    print("RESULT " + json.dumps(SCENARIOS[name](*rest)))
