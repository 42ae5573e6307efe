#!/usr/bin/python3
"""Tests of gpu_bandwidth_model.py: /usr/bin/python3 tests/scripts/test_gpu_bandwidth_model.py [TRAIN_RESNET]

With the path of a train_resnet binary, the model's batch norms are also checked against the ones
ringtrain's ResNet-18 and ResNet-50 run (their names in a CPU --profile-layers record)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
sys.path.insert(0, HERE)
import gpu_bandwidth_model as bm  # noqa: E402

TRAIN_RESNET = None


class Model(unittest.TestCase):
    def test_counts_match_the_gpu_profiles_calls(self):
        # --profile on the H200 (docs/GPU.md): 53 bn_fwd calls a ResNet-50 step.
        for model, count in (("resnet50", 53), ("resnet18", 20)):
            layers = [l for l in bm.bn_layers(model, 224) if l[4] != "grad_sum"]
            self.assertEqual(len(layers), count, model)

    def test_one_layer_by_hand(self):
        # ResNet-18 b1 at 32 px: the stem's BN + ReLU is 16 x 16 x 64 = 16384 elements.
        stem = bm.bn_layers("resnet18", 32)[0]
        self.assertEqual(stem, ("bn1", 16, 16, 64, "relu"))
        fam, _ = bm.model_bytes("resnet18", 1, 32, 2, fused_relu_backward=True)
        n = 16384
        # Every block: conv BN + ReLU (fwd 4n, bwd 5n), residual BN (fwd 5n, bwd 5n, mask 3n), input grad 3n.
        per_bn_fwd = sum((5 if k == "add_relu" else 4) * h * w * c * 2
                         for _, h, w, c, k in bm.bn_layers("resnet18", 32) if k != "grad_sum")
        self.assertEqual(fam["bn_fwd"], per_bn_fwd)
        self.assertEqual(fam["pool"], 2 * (n * 2 + (n // 4) * 10))

    def test_fused_relu_backward_only_drops_masks(self):
        before, _ = bm.model_bytes("resnet50", 256, 224, 2, fused_relu_backward=False)
        after, _ = bm.model_bytes("resnet50", 256, 224, 2, fused_relu_backward=True)
        self.assertLess(after["elementwise"], before["elementwise"])
        for f in ("bn_fwd", "bn_bwd", "pool"):
            self.assertEqual(after[f], before[f], f)

    def test_cli(self):
        out = subprocess.run([sys.executable, os.path.join(HERE, "gpu_bandwidth_model.py"), "--json"],
                             capture_output=True, text=True, check=True).stdout
        doc = json.loads(out)
        self.assertEqual(doc["batch_norms"], 53)
        self.assertAlmostEqual(doc["total"]["ms_after"], doc["total"]["gb_after"] / 4.3, places=6)
        bad = subprocess.run([sys.executable, os.path.join(HERE, "gpu_bandwidth_model.py"), "--image", "100"],
                             capture_output=True, text=True)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("--image", bad.stderr)


class AgainstRingtrain(unittest.TestCase):
    def test_batch_norm_names_are_the_models(self):
        if not TRAIN_RESNET:
            self.skipTest("no train_resnet given")
        for model in ("resnet18", "resnet50"):
            with tempfile.TemporaryDirectory() as tmp:
                log = os.path.join(tmp, "run.jsonl")
                subprocess.run(["timeout", "300", TRAIN_RESNET, "--synthetic", "-a", model, "--image-size", "32",
                                "-b", "2", "--steps", "4", "--device", "cpu", "--threads", "1", "--profile",
                                "--profile-steps", "1", "--profile-layers", "--log-jsonl", log],
                               check=True, capture_output=True)
                with open(log) as f:
                    records = [json.loads(line) for line in f]
                profile = [r for r in records if r.get("type") == "profile"]
                self.assertTrue(profile, model + ": no profile record")
                ran = sorted(r["layer"] for r in profile[0]["layers"] if r["family"] == "bn_fwd")
                modelled = sorted(l[0] for l in bm.bn_layers(model, 224) if l[4] != "grad_sum")
                self.assertEqual(ran, modelled, model)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        TRAIN_RESNET = sys.argv.pop(1)
    unittest.main(verbosity=2)
