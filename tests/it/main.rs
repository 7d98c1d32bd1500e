mod run;
mod script;
mod ssh;
mod support;
