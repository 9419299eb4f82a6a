"""What one optimizer step is made of: the loss (:mod:`.loss`), mixed precision (:mod:`.amp`), non-finite
gradients and the loss scale (:mod:`.overflow`), the optimizer (:mod:`.optimization`: construction and weight-decay
selection; :mod:`.adamw`: the AdamW it builds by default) and the LR schedules (:mod:`.schedules`)."""
