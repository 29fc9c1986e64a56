"""Scores of a clustering against true labels."""

import numpy as np
from scipy.optimize import linear_sum_assignment
from sklearn.metrics import adjusted_rand_score


def clustering_scores(clusters, labels, num_clusters):
    """(accuracy after the best one-to-one matching of clusters to labels, adjusted Rand index)."""
    clusters, labels = np.asarray(clusters), np.asarray(labels)
    num_labels = int(labels.max()) + 1
    counts = np.zeros((num_clusters, num_labels))
    np.add.at(counts, (clusters, labels), 1)
    rows, cols = linear_sum_assignment(-counts)
    return float(counts[rows, cols].sum() / len(labels)), float(adjusted_rand_score(labels, clusters))
