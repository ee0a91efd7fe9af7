pub use murmur_engine as engine;
