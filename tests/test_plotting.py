"""The figures' elements, read through matplotlib (not pixels)."""

from fedjax_sel.host.plotting import MAX_COLUMNS, panels_figure


def _runs(offset, seeds=3, rounds=5, filtered=False):
  return [[{"round": t, "test_accuracy": 0.1 * t + offset, "test_loss": 2.0 - 0.1 * t,
            "num_filtered": 10 + s, **({"filtered_in": [0]} if filtered else {})}
           for t in range(rounds)] for s in range(seeds)]


def test_figure_has_units_one_legend_seeds_and_at_most_four_panels_a_row():
  rows = {"iid": {"FedAvg": _runs(0.0), "FilFL": _runs(0.05, filtered=True)},
          "noniid": {"FedAvg": _runs(0.0), "FilFL": _runs(0.02, filtered=True)}}
  fig = panels_figure(rows, ["test_accuracy", "test_loss", "num_filtered"],
                      titles={"num_filtered": "|S^f|"}, title="digits",
                      only={"num_filtered": lambda label: label != "FedAvg"})
  axes = [ax for ax in fig.axes if ax.get_visible()]
  assert len(axes) == 6
  columns = {round(ax.get_position().x0, 3) for ax in axes}
  assert len(columns) <= MAX_COLUMNS
  assert fig._suptitle.get_text() == "digits (mean +- sample std over 3 seeds)"  # pylint: disable=protected-access
  assert {ax.get_xlabel() for ax in axes} == {"rounds trained"}
  ylabels = {ax.get_title(): ax.get_ylabel() for ax in axes}
  assert ylabels["iid: test accuracy"] == "accuracy"
  assert ylabels["noniid: test loss"] == "cross-entropy (nats)"
  assert ylabels["iid: |S^f|"] == "clients"
  assert len(fig.legends) == 1 and all(ax.get_legend() is None for ax in axes)
  assert [t.get_text() for t in fig.legends[0].get_texts()] == ["FedAvg", "FilFL"]
  filtered = next(ax for ax in axes if ax.get_title() == "iid: |S^f|")
  assert [line.get_label() for line in filtered.get_lines()] == ["FilFL"]  # Not FedAvg's.
  accuracy = next(ax for ax in axes if ax.get_title() == "iid: test accuracy")
  styles = {line.get_label(): (line.get_color(), line.get_linestyle(), line.get_marker())
            for line in accuracy.get_lines()}
  assert len(set(styles.values())) == 2
  assert styles["FilFL"] == next((line.get_color(), line.get_linestyle(), line.get_marker())
                                 for line in filtered.get_lines())
  assert list(accuracy.get_lines()[0].get_xdata()) == [1, 2, 3, 4, 5]  # Rounds trained.


def test_each_set_of_runs_starts_a_row_and_the_title_stays_clear_of_the_panels():
  rows = {name: {"FedAvg": _runs(0.0), "FilFL": _runs(0.05)} for name in ("low", "high")}
  keys = ["test_accuracy", "test_loss", "num_filtered", "test_accuracy", "test_loss"]
  fig = panels_figure(rows, keys, title="synth")
  axes = [ax for ax in fig.axes if ax.get_visible()]
  assert len(axes) == 10
  tops = {ax.get_title().split(":")[0]: set() for ax in axes}
  for ax in axes:
    tops[ax.get_title().split(":")[0]].add(round(ax.get_position().y0, 3))
  assert not tops["low"] & tops["high"]  # No row holds panels of both.
  renderer = fig.canvas.get_renderer()
  title = fig._suptitle.get_window_extent(renderer)  # pylint: disable=protected-access
  assert all(ax.title.get_window_extent(renderer).y1 <= title.y0 for ax in axes)
  filtered = next(ax for ax in axes if ax.get_title() == "low: num filtered")
  band = filtered.collections[0].get_paths()[0].vertices[:, 1]
  assert (band.min(), band.max()) == (10.0, 12.0)  # 10, 11, 12 over seeds: mean 11, sample std 1.


def test_one_seed_has_no_band_and_says_so():
  fig = panels_figure({"": {"FedAvg": _runs(0.0, seeds=1)}}, ["test_accuracy"], title="x")
  assert fig._suptitle.get_text() == "x (1 seed)"  # pylint: disable=protected-access
  assert not fig.axes[0].collections  # No std band over one seed.
