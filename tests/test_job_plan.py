"""How a launcher's job plans its methods' rounds: which run as three programs to share a
compiled training (`experiments/launch/job.py`)."""

import types

import optax

import fedjax_sel as fs
from experiments.launch.job import shared_training
from fedjax_sel.parts.filters import filfl as filtering
from fedjax_sel.models import per_example_loss


DATA = fs.build_dataset(fs.DatasetSpec("digits", num_clients=10, public_fraction=0.05), seed=0)


def _method(selector, **kw):
  data = DATA
  model = fs.build_model("logreg", data.feature_shape, data.num_classes)
  spec = fs.build_run(model, data, lambda lr: optax.sgd(lr), fs.LocalHParams(batch_size=16),
                      fs.uniform_availability(10, 6), selector, fs.fedavg(), 3, 0, **kw)
  return [types.SimpleNamespace(spec=spec)]


def test_methods_that_train_alike_share_their_training_and_a_method_alone_keeps_one_program():
  model = fs.build_model("logreg", DATA.feature_shape, DATA.num_classes)
  public = lambda p, x, y: per_example_loss(model, p, x, y).mean()
  dgf = filtering.filfl_filter(public, filtering.FilterConfig("dgf", period=2))
  methods = [_method(fs.random_selector()), _method(fs.power_of_choice(d=8)),
             _method(fs.random_selector(), filter=dgf)]  # Trains n slots, not K: alone.
  assert shared_training(methods) == [True, True, False]
  assert shared_training(methods[:1] * 2) == [False, False]  # One round program: one method.
