"""Reading hidden-state dumps: the four layouts, streaming, and every way a dump can be bad."""

from __future__ import annotations

import gzip
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from safetensors.torch import save_file  # noqa: E402

from rca.inputs.dumps import FORMATS, DumpError, open_dumps  # noqa: E402
from tests.dumpwriters import random_samples, write_dumps  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def one_line_error(path: Path, base: Path | None = None, hidden_size: int | None = None, read: bool = False) -> str:
    """The DumpError that opening (and, with `read`, streaming) the dumps raises."""
    with pytest.raises(DumpError) as error:
        dumps = open_dumps(path, base, hidden_size)
        if read:
            list(dumps.samples())
    text = str(error.value)
    assert "\n" not in text and "(fix: " in text
    return text


def write_pt(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(data, path)
    return path


# -- round trips -------------------------------------------------------------------------------------


@pytest.mark.parametrize("format, gzipped", [(name, False) for name in FORMATS] + [("specforge-ckpt", True)])
def test_round_trip_gives_back_slots_in_order(tmp_path: Path, format: str, gzipped: bool) -> None:
    ids, captures, lasts = random_samples([5, 7, 4], slots=3, hidden=8)
    files = write_dumps(tmp_path / "dumps", format, ids, captures, lasts, layer_ids=[1, 15, 28], gzipped=gzipped)
    dumps = open_dumps(tmp_path / "dumps", base=tmp_path)
    assert (dumps.format, dumps.files, dumps.directory) == (format, tuple(files), tmp_path / "dumps")
    assert dumps.bytes == sum(file.stat().st_size for file in files)
    samples = list(dumps.samples())
    assert [sample.path for sample in samples] == [file.relative_to(tmp_path).as_posix() for file in files]
    for sample, want_ids, want_slots, want_last in zip(samples, ids, captures, lasts, strict=True):
        assert sample.format == format
        assert sample.token_ids.dtype == torch.int64 and torch.equal(sample.token_ids, want_ids)
        assert len(sample.slots) == 3
        assert all(torch.equal(got, want) for got, want in zip(sample.slots, want_slots, strict=True))
        assert torch.equal(sample.verifier_last, want_last)


def test_bf16_and_int32_come_back_unchanged(tmp_path: Path) -> None:
    ids, captures, lasts = random_samples([6], slots=2, hidden=4)
    captures = [[slot.bfloat16() for slot in captures[0]]]
    write_dumps(tmp_path, "speculators-safetensors", [ids[0].int()], captures, [lasts[0].bfloat16()])
    sample = next(open_dumps(tmp_path).samples())
    assert sample.slots[0].dtype == torch.bfloat16 and torch.equal(sample.slots[1], captures[0][1])
    assert sample.token_ids.dtype == torch.int64 and torch.equal(sample.token_ids, ids[0])


def test_generic_safetensors_without_verifier_and_with_token_ids_key(tmp_path: Path) -> None:
    ids, captures, _ = random_samples([5], slots=2, hidden=4)
    save_file({"hidden_states": torch.stack(captures[0], dim=1), "token_ids": ids[0]}, tmp_path / "capture.safetensors")
    sample = next(open_dumps(tmp_path).samples())
    assert sample.verifier_last is None
    assert torch.equal(sample.token_ids, ids[0]) and torch.equal(sample.slots[1], captures[0][1])


def test_specforge_without_hidden_state_is_split_by_the_targets_hidden_size(tmp_path: Path) -> None:
    ids, captures, _ = random_samples([5], slots=3, hidden=4)
    write_dumps(tmp_path, "specforge-ckpt", ids, captures)
    sample = next(open_dumps(tmp_path, hidden_size=4).samples())
    assert sample.verifier_last is None
    assert all(torch.equal(got, want) for got, want in zip(sample.slots, captures[0], strict=True))
    assert "--target" in one_line_error(tmp_path)
    assert "not a multiple of the target's hidden_size width 5" in one_line_error(tmp_path, hidden_size=5)


def test_specforge_ids_without_batch_dimension(tmp_path: Path) -> None:
    ids, captures, lasts = random_samples([5], slots=3, hidden=4)
    write_pt(
        tmp_path / "data_0.ckpt",
        {"input_ids": ids[0][None], "aux_hidden_state": torch.cat(captures[0], -1), "hidden_state": lasts[0]},
    )
    sample = next(open_dumps(tmp_path).samples())
    assert torch.equal(sample.token_ids, ids[0]) and torch.equal(sample.slots[2], captures[0][2])


def test_single_file_and_metadata_files_are_accepted(tmp_path: Path) -> None:
    ids, captures, lasts = random_samples([3, 4], slots=2, hidden=4)
    files = write_dumps(tmp_path, "speculators-pt", ids, captures, lasts, layer_ids=[1, 2])
    (tmp_path / "README.txt").write_text("notes\n")
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "stale.safetensors").write_bytes(b"junk")
    assert open_dumps(tmp_path).files == tuple(files)
    single = open_dumps(files[1])
    assert single.files == (files[1],)
    assert [len(sample.token_ids) for sample in single.samples()] == [4]


# -- order and streaming -----------------------------------------------------------------------------


def test_files_sort_naturally(tmp_path: Path) -> None:
    ids, captures, lasts = random_samples([2] * 12, slots=2, hidden=4)
    write_dumps(tmp_path, "speculators-pt", ids, captures, lasts)
    dumps = open_dumps(tmp_path)
    assert [file.name for file in dumps.files] == [f"data_{index}.pt" for index in range(12)]
    assert all(torch.equal(sample.token_ids, want) for sample, want in zip(dumps.samples(), ids, strict=True))


def test_specforge_row_groups_are_found_and_sort_naturally(tmp_path: Path) -> None:
    for index in (5000, 10, 2, 10001):
        group = index // 5000 * 5000
        sample = {
            "input_ids": torch.tensor([index]),
            "aux_hidden_state": torch.zeros(1, 1, 8),
            "hidden_state": torch.zeros(1, 1, 4),
        }
        write_pt(tmp_path / f"rows_{group}-{group + 5000}" / f"data_{index}.ckpt", sample)
    dumps = open_dumps(tmp_path, base=tmp_path)
    assert [file.relative_to(tmp_path).as_posix() for file in dumps.files] == [
        "rows_0-5000/data_2.ckpt",
        "rows_0-5000/data_10.ckpt",
        "rows_5000-10000/data_5000.ckpt",
        "rows_10000-15000/data_10001.ckpt",
    ]
    assert [int(sample.token_ids) for sample in dumps.samples()] == [2, 10, 5000, 10001]


def test_max_tokens_truncates_the_last_sample_and_stops(tmp_path: Path) -> None:
    ids, captures, lasts = random_samples([5, 7, 4], slots=2, hidden=4)
    files = write_dumps(tmp_path, "speculators-safetensors", ids, captures, lasts)
    files[2].write_bytes(b"not read")
    dumps = open_dumps(tmp_path)
    samples = list(dumps.samples(max_tokens=9))
    assert [len(sample.token_ids) for sample in samples] == [5, 4]
    last = samples[1]
    assert (
        torch.equal(last.token_ids, ids[1][:4])
        and torch.equal(last.slots[1], captures[1][1][:4])
        and torch.equal(last.verifier_last, lasts[1][:4])
    )
    assert [len(sample.token_ids) for sample in dumps.samples(max_tokens=12)] == [5, 7]
    assert list(dumps.samples(max_tokens=0)) == []


def test_samples_stream_one_file_at_a_time(tmp_path: Path) -> None:
    ids, captures, lasts = random_samples([3, 3], slots=2, hidden=4)
    files = write_dumps(tmp_path, "speculators-pt", ids, captures, lasts)
    files[1].write_bytes(files[1].read_bytes()[:40])
    stream = open_dumps(tmp_path, base=tmp_path).samples()
    assert inspect.isgenerator(stream)
    assert torch.equal(next(stream).token_ids, ids[0])
    with pytest.raises(DumpError, match=r"data_1\.pt: truncated or corrupt torch\.save file"):
        next(stream)


# -- paths that are not dump directories ------------------------------------------------------------


def test_missing_and_empty_paths(tmp_path: Path) -> None:
    assert "does not exist" in one_line_error(tmp_path / "nowhere")
    (tmp_path / "data_config.json").write_text("{}")
    assert "holds no hidden-state dump files" in one_line_error(tmp_path)
    assert "not a hidden-state dump file" in one_line_error(tmp_path / "data_config.json")


def test_mixed_formats_are_listed(tmp_path: Path) -> None:
    ids, captures, lasts = random_samples([3], slots=2, hidden=4)
    write_dumps(tmp_path, "speculators-pt", ids, captures, lasts)
    write_dumps(tmp_path, "speculators-safetensors", ids, captures, lasts)
    text = one_line_error(tmp_path)
    assert (
        "mixes dump formats" in text
        and "speculators-pt (e.g. data_0.pt)" in text
        and "speculators-safetensors (e.g. hs_0.safetensors)" in text
    )


# -- files that are not what they claim -------------------------------------------------------------


class Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("name", ["data_0.pt", "data_0.ckpt.gz"])
def test_pickled_code_is_refused_not_run(tmp_path: Path, name: str) -> None:
    marker = tmp_path / "pwned"
    ids, captures, lasts = random_samples([3], slots=2, hidden=4)
    data = {
        "input_ids": ids[0],
        "hidden_states": captures[0] + lasts,
        "aux_hidden_state": torch.cat(captures[0], -1),
        "hidden_state": lasts[0],
        "extra": Payload(marker),
    }
    path = write_pt(tmp_path / "dumps" / "data_0.pt", data)
    if name.endswith(".gz"):
        path.with_name(name).write_bytes(gzip.compress(path.read_bytes()))
        path.unlink()
    text = one_line_error(tmp_path / "dumps")
    assert "refuses to unpickle code" in text and "system" in text and "convert it to safetensors" in text
    assert not marker.exists()


def test_truncated_safetensors(tmp_path: Path) -> None:
    ids, captures, lasts = random_samples([4], slots=2, hidden=4)
    (file,) = write_dumps(tmp_path, "speculators-safetensors", ids, captures, lasts)
    file.write_bytes(file.read_bytes()[:-10])
    assert "hs_0.safetensors: truncated or corrupt safetensors file" in one_line_error(tmp_path, base=tmp_path)
    file.write_bytes(b"\x00" * 4)
    assert "truncated or corrupt safetensors file" in one_line_error(tmp_path)


def test_corrupt_gzip_and_corrupt_pt(tmp_path: Path) -> None:
    ids, captures, lasts = random_samples([4], slots=2, hidden=4)
    (file,) = write_dumps(tmp_path / "gz", "specforge-ckpt", ids, captures, lasts, gzipped=True)
    file.write_bytes(file.read_bytes()[:30])
    assert "truncated or corrupt gzip file" in one_line_error(tmp_path / "gz")
    file.write_bytes(b"\x1f\x8b not gzip at all")
    assert "truncated or corrupt gzip file" in one_line_error(tmp_path / "gz")
    (file,) = write_dumps(tmp_path / "pt", "speculators-pt", ids, captures, lasts)
    file.write_bytes(file.read_bytes()[:-50])
    assert "truncated or corrupt torch.save file" in one_line_error(tmp_path / "pt")


def test_missing_keys_name_the_key_and_the_keys_present(tmp_path: Path) -> None:
    ids, captures, lasts = random_samples([4], slots=2, hidden=4)
    write_pt(tmp_path / "a" / "data_0.pt", {"input_ids": ids[0], "loss_mask": ids[0]})
    assert "has no hidden_states (it has: input_ids, loss_mask)" in one_line_error(tmp_path / "a")
    (tmp_path / "b").mkdir()
    save_file(
        {"hidden_states": torch.stack(captures[0] + lasts, 1), "input_ids": ids[0]}, tmp_path / "b" / "hs_0.safetensors"
    )
    assert "has no token_ids (it has: hidden_states, input_ids)" in one_line_error(tmp_path / "b")
    write_pt(tmp_path / "c" / "data_0.ckpt", {"input_ids": ids[0], "hidden_state": lasts[0][None]})
    assert "has no aux_hidden_state (it has: input_ids, hidden_state)" in one_line_error(tmp_path / "c")
    write_pt(tmp_path / "d" / "data_0.pt", [ids[0]])
    assert "holds a list, not a dict of tensors" in one_line_error(tmp_path / "d")


def bad_shape(tmp_path: Path, name: str, data: dict) -> str:
    directory = tmp_path / name
    directory.mkdir()
    if name.endswith(".safetensors"):
        save_file(data, directory / name)
    else:
        write_pt(directory / name, data)
    return one_line_error(directory)


def test_wrong_shapes(tmp_path: Path) -> None:
    ids = torch.arange(4)
    h = torch.zeros(4, 8)
    assert "hidden_states has shape [4, 8], not [S, n, H]" in bad_shape(
        tmp_path, "hs_0.safetensors", {"hidden_states": h, "token_ids": ids}
    )
    assert "has 4 rows but the file has 5 token ids" in bad_shape(
        tmp_path, "data_0.pt", {"input_ids": torch.arange(5), "hidden_states": [h, h, h]}
    )
    assert "widths differ: slot 0 (hidden_states[0]) is 8, slot 1 (hidden_states[1]) is 6" in bad_shape(
        tmp_path, "data_1.pt", {"input_ids": ids, "hidden_states": [h, h[:, :6], h]}
    )
    assert "aux_hidden_state is 20 wide, not a multiple of hidden_state's width 8" in bad_shape(
        tmp_path, "data_0.ckpt", {"input_ids": ids, "aux_hidden_state": torch.zeros(1, 4, 20), "hidden_state": h[None]}
    )
    assert "hidden_states holds 1 layer(s): no slot is left" in bad_shape(
        tmp_path, "data_2.pt", {"input_ids": ids, "hidden_states": [h]}
    )
    assert "hidden_states holds 1 layer(s): no slot is left" in bad_shape(
        tmp_path, "hs_1.safetensors", {"hidden_states": h[:, None], "token_ids": ids}
    )
    assert "token ids have shape [2, 4], not [S]" in bad_shape(
        tmp_path, "x.safetensors", {"hidden_states": h[:, None], "input_ids": torch.zeros(2, 4, dtype=torch.int64)}
    )
    assert "slot 1 (hidden_states[1]) has shape [4, 2, 4], not [S, H]" in bad_shape(
        tmp_path, "data_3.pt", {"input_ids": ids, "hidden_states": [h, h.view(4, 2, 4), h]}
    )


@pytest.mark.parametrize("format", FORMATS)
def test_non_finite_values_name_the_slot_and_count(tmp_path: Path, format: str) -> None:
    ids, captures, lasts = random_samples([4], slots=3, hidden=4)
    captures[0][1][0, :3] = float("nan")
    captures[0][1][2, 0] = float("inf")
    write_dumps(tmp_path / "slot", format, ids, captures, lasts)
    assert "slot 1 (" in (text := one_line_error(tmp_path / "slot")) and "has 4 NaN or Inf value(s)" in text
    captures[0][1].nan_to_num_(0.0, 0.0, 0.0)
    lasts[0][3, 3] = float("-inf")
    write_dumps(tmp_path / "last", format, ids, captures, lasts)
    assert (
        "the verifier's last state (" in (text := one_line_error(tmp_path / "last"))
        and "has 1 NaN or Inf value(s)" in text
    )


def test_wrong_dtypes(tmp_path: Path) -> None:
    h = torch.zeros(4, 4)
    assert "slot 0 (hidden_states[:, 0]) is torch.int32, not floating point" in bad_shape(
        tmp_path,
        "hs_0.safetensors",
        {"hidden_states": torch.zeros(4, 2, 4, dtype=torch.int32), "token_ids": torch.arange(4)},
    )
    assert "token ids are torch.float32, not integers" in bad_shape(
        tmp_path, "data_0.pt", {"input_ids": torch.zeros(4), "hidden_states": [h, h]}
    )
    assert "input_ids is a list, not a tensor" in bad_shape(
        tmp_path, "data_1.pt", {"input_ids": [1, 2, 3, 4], "hidden_states": [h, h]}
    )


def test_a_bad_second_file_fails_only_when_read(tmp_path: Path) -> None:
    ids, captures, lasts = random_samples([3, 3], slots=2, hidden=4)
    files = write_dumps(tmp_path, "safetensors", ids, captures, lasts)
    save_file({"hidden_states": torch.zeros(3, 4)}, files[1])
    dumps = open_dumps(tmp_path, base=tmp_path)
    assert "sample_1.safetensors: has no input_ids or token_ids (it has: hidden_states)" in one_line_error(
        tmp_path, read=True
    )
    assert len(dumps.files) == 2


# -- without torch ----------------------------------------------------------------------------------


def test_without_torch_the_module_imports_and_reading_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = "import sys, rca.inputs.dumps; assert 'torch' not in sys.modules and 'safetensors' not in sys.modules"
    subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, check=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    )
    monkeypatch.setitem(sys.modules, "torch", None)
    text = one_line_error(tmp_path)
    assert "reading dumps needs torch" in text and "rca[probes]" in text
