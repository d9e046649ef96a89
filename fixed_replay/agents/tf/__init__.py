"""Offline agents on Dopamine's TensorFlow agents."""
