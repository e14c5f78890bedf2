"""speculative/training/evaluation.py: FLOPs per token."""



from speculative.models import t5
from speculative.training import evaluation


def test_flops_per_token_arithmetic():
    cfg = t5.T5Config(vocab_size=4000, emb_dim=10, num_heads=2, head_dim=8, mlp_dim=32,
                      num_encoder_layers=1, num_decoder_layers=1,
                      mlp_activations=("gelu", "linear"), logits_via_embedding=True)
    f = evaluation.decoder_flops_per_token(cfg, self_len=16, enc_len=20)
    layer = 6 * 10 * 16 + 3 * 10 * 32 + 2 * 16 * (16 + 20)
    assert f == {"decoder_layers": 2 * layer, "output_layer": 2 * 10 * 4000,
                 "total": 2 * (layer + 10 * 4000)}
