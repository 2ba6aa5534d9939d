"""labutils.data.datasets: the digits split is fixed and the right size, the character tokeniser
round-trips the corpus, the video generator is deterministic and its digit really moves."""
import hashlib

import numpy as np
import pytest
import torch

from labutils import datasets as data

pytestmark = [pytest.mark.lab02, pytest.mark.usefixtures("one_thread")]


def test_digits_split_is_fixed_and_sized():
    X, y = data.digits("train")
    Xt, yt = data.digits("test")
    assert X.shape == (1437, 1, 8, 8) and Xt.shape == (360, 1, 8, 8)
    assert X.dtype == torch.float32 and y.dtype == torch.int64
    assert set(y.tolist()) == set(range(10)) and set(yt.tolist()) == set(range(10))
    # Normalised with the training statistics.
    assert abs(float(X.mean())) < 1e-5 and abs(float(X.std()) - 1) < 1e-4
    # Fixed split: these labels and this pixel are what every run, rank and machine sees.
    assert y[:10].tolist() == [7, 1, 9, 8, 5, 0, 4, 5, 6, 5]
    X2, y2 = data.digits("train")
    torch.testing.assert_close(X, X2, rtol=0, atol=0)
    # Train and test are disjoint and together are the whole data set.
    d = data._digits_all()
    assert sorted(torch.cat([d["train_idx"], d["test_idx"]]).tolist()) == list(range(1797))


def test_digits_returns_copies():
    X, _ = data.digits("train")
    X.zero_()
    assert float(data.digits("train")[0].abs().sum()) > 0


def test_digits_file_is_the_uci_test_set():
    """The shipped data/digits/digits.csv.gz is the pinned file (scikit-learn 1.9.1's copy of the
    UCI optdigits test set, see data/digits/README.md), and the loader reads it unchanged."""
    path = data.digits_path()
    assert path.parts[-3:] == ("data", "digits", "digits.csv.gz")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == data.DIGITS_SHA256
    table = np.loadtxt(path, delimiter=",", dtype=np.int64)
    assert table.shape == (1797, 65)
    pixels, labels = table[:, :64], table[:, 64]
    assert pixels.min() == 0 and pixels.max() == 16
    assert np.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    # the loader's test split is exactly these rows
    images, y = data.digits_raw("test")
    idx = data._digits_all()["test_idx"].numpy()
    torch.testing.assert_close(images, torch.tensor(pixels[idx].reshape(-1, 8, 8),
                                                    dtype=torch.float32) / 16, rtol=0, atol=0)
    assert y.tolist() == labels[idx].tolist()


def test_bad_split_names_the_choices():
    with pytest.raises(ValueError, match="'train', 'test'"):
        data.digits("validation")


def test_tokeniser_round_trips_the_corpus():
    text = data.corpus()
    assert len(text) > 50_000 and "Execution model" in text
    tok = data.tokenizer()
    ids = tok.encode(text)
    assert ids.dtype == torch.int64 and int(ids.max()) < tok.vocab_size
    assert tok.decode(ids) == text
    assert tok.decode(tok.encode("A frame contains")) == "A frame contains"
    with pytest.raises(ValueError, match="not in the corpus vocabulary"):
        tok.encode("日本")


def test_text_split_and_windows():
    train, test = data.text("train"), data.text("test")
    assert len(train) + len(test) == len(data.corpus())
    assert 0.08 < len(test) / (len(train) + len(test)) < 0.12
    X, Y = data.text_windows(train, 32)
    assert X.shape == Y.shape and X.shape[1] == 32
    torch.testing.assert_close(X[0, 1:], Y[0, :-1])     # Y is X shifted by one
    torch.testing.assert_close(X[1, 0], Y[0, -1])       # windows are consecutive


def test_video_generator_is_deterministic():
    images, _ = data.digits_raw("train")
    a = data.make_clips(images, 20, seed=5)
    b = data.make_clips(images, 20, seed=5)
    c = data.make_clips(images, 20, seed=6)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert not torch.equal(a[0], c[0])


def _center_of_mass(frame):
    rows = torch.arange(frame.shape[0], dtype=torch.float32)
    mass = frame.sum()
    return float((frame.sum(1) * rows).sum() / mass), float((frame.sum(0) * rows).sum() / mass)


def test_video_digit_moves_one_pixel_per_frame_in_its_direction():
    images, _ = data.digits_raw("train")
    clips, direction, which = data.make_clips(images, 40, frames=8, size=16, seed=0)
    assert clips.shape == (40, 1, 8, 16, 16)
    assert set(direction.tolist()) == {0, 1, 2, 3}
    steps = {"right": (0, 1), "left": (0, -1), "down": (1, 0), "up": (-1, 0)}
    for i in range(40):
        dy, dx = steps[data.DIRECTIONS[direction[i]]]
        frames = clips[i, 0]
        # The whole digit is in every frame (nothing clipped at the border).
        for t in range(8):
            torch.testing.assert_close(frames[t].sum(), images[which[i]].sum())
        (r0, c0), (r7, c7) = _center_of_mass(frames[0]), _center_of_mass(frames[7])
        assert (round(r7 - r0, 4), round(c7 - c0, 4)) == (7 * dy, 7 * dx)
        # And frame t is frame 0 shifted by t pixels: the same digit, moved.
        shifted = torch.roll(frames[0], shifts=(3 * dy, 3 * dx), dims=(0, 1))
        torch.testing.assert_close(frames[3], shifted)


def test_moving_digits_train_and_test_use_their_own_digits():
    clips, direction = data.moving_digits("test")
    assert clips.shape == (256, 1, 8, 16, 16) and direction.shape == (256,)
    digit = data.moving_digits_digit_labels("test")
    assert digit.shape == (256,) and set(digit.tolist()) <= set(range(10))
    clips2, _ = data.moving_digits("test")
    torch.testing.assert_close(clips, clips2, rtol=0, atol=0)


def test_video_refuses_a_frame_too_small_for_the_path():
    images, _ = data.digits_raw("train")
    with pytest.raises(ValueError, match="size >= 15"):
        data.make_clips(images, 2, frames=8, size=12)
