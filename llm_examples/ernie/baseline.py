"""A bag-of-characters logistic regression: the reference a sentiment model's test accuracy is read against.

Features are character counts (every character of the text, nothing else: no words, no n-grams).
The inverse regularisation strength ``C`` is chosen on the dev split from a small grid, the model is
refit on the train split with it, and its accuracy on the test split is reported. Deterministic
(lbfgs, no random state involved) and the same on every machine: the L2-regularised loss has one optimum,
and lbfgs is run to it (``TOL``). With scikit-learn's default tolerance (1e-4) it stopped early, at a point
that depended on the BLAS kernels OpenBLAS picks for the CPU: decision values moved by up to 0.007 and one
test review flipped between machines (0.7976 here, 0.7971 with ``OPENBLAS_CORETYPE=Haswell``); at 1e-8 both agree to
1e-5 while the closest test review is 0.0036 from the boundary.
"""
import numpy as np

C_GRID = (0.1, 0.3, 1.0, 3.0)
TOL = 1e-8  # converged, not stopped early: see the module docstring


def char_logreg_accuracy(train, dev, test):
    """``{"test_accuracy", "dev_accuracy", "C", "train_size", "test_size"}`` for lists of ``{"text", "label"}``."""
    from sklearn.feature_extraction.text import CountVectorizer  # heavy import, only when asked for
    from sklearn.linear_model import LogisticRegression

    for name, rows in (("train", train), ("dev", dev), ("test", test)):
        if not rows or any(ex["label"] is None for ex in rows):
            raise ValueError(f"the baseline needs a labeled, non-empty {name} split")
    vectorizer = CountVectorizer(analyzer="char", lowercase=True)
    x_train = vectorizer.fit_transform([ex["text"] for ex in train])
    y_train = np.array([ex["label"] for ex in train])

    def fit(c):
        return LogisticRegression(C=c, tol=TOL, max_iter=3000).fit(x_train, y_train)

    def accuracy(model, rows):
        x = vectorizer.transform([ex["text"] for ex in rows])
        return float((model.predict(x) == np.array([ex["label"] for ex in rows])).mean())

    dev_scores = {c: accuracy(fit(c), dev) for c in C_GRID}
    best_c = max(C_GRID, key=lambda c: (dev_scores[c], -c))  # ties: the stronger regularisation
    model = fit(best_c)
    return {"test_accuracy": accuracy(model, test), "dev_accuracy": dev_scores[best_c], "C": best_c,
            "train_size": len(train), "test_size": len(test)}
