"""A ``PipelineLayer`` without ``_prepare_pipeline_inputs_func`` (PaddleNLP's GPT Pipe class): dict micro-batches
are split as PaddleNLP's Trainer splits them by default — input ids, attention mask and position ids (those
present) to the first stage, labels to the last, one present key as the tensor itself."""
import paddle

from paddletrainer.parallel.pipeline import default_pipeline_inputs, stack_micro_batches


def batch(*keys):
    return {key: paddle.full([2, 4], float(i)) for i, key in enumerate(keys)}


def test_dict_micro_batches_of_a_model_without_an_input_function_go_inputs_first_labels_last():
    first, last = default_pipeline_inputs(batch("labels", "attention_mask", "input_ids", "loss_mask"))
    assert [float(t[0, 0]) for t in first] == [2.0, 1.0] and float(last[0, 0]) == 0.0  # in key order, not dict order
    first, last = default_pipeline_inputs(batch("input_ids"))  # prediction: no labels
    assert isinstance(first, paddle.Tensor) and last == ()

    inputs, labels = stack_micro_batches([batch("input_ids", "labels")] * 3, paddle.nn.Layer())
    assert len(inputs) == len(labels) == 3 and all(isinstance(t, paddle.Tensor) for t in inputs + labels)
